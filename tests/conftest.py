import pytest

from tests.checkpoints import CONFIGS, build_checkpoint

MODEL_TYPES = sorted(CONFIGS)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(model_type, shard=True) → directory of a tiny random-init HF checkpoint (cached)."""
    built: dict[tuple[str, bool], object] = {}

    def get(model_type: str, shard: bool = True):
        key = (model_type, shard)
        if key not in built:
            out = tmp_path_factory.mktemp(f"{model_type}{'_sharded' if shard else ''}")
            built[key] = build_checkpoint(model_type, out, shard=shard)
        return built[key]

    return get


@pytest.fixture(scope="session")
def hf_model():
    """hf_model(dir) → the transformers model loaded from the same directory (cached)."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = {}

    def get(path):
        if path not in loaded:
            loaded[path] = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        return loaded[path]

    return get
