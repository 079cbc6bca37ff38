import os
import tempfile

# The suite runs many model processes at once (the bad-input table, servers, EP ranks): their OpenMP
# threads sleep between regions, as moetune chooses on a busy machine (engine/threads.py), set here
# before anything loads torch, and inherited by every subprocess.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# this-machine calibrations (search/machine_cache.py) are cached in a directory of the suite's own,
# never the user's cache; tests that need an empty cache point it at their tmp_path.
os.environ.setdefault("MOETUNE_CACHE_DIR", tempfile.mkdtemp(prefix="moetune-test-cache-"))

import pytest  # noqa: E402

from tests.checkpoints import CONFIGS, build_checkpoint  # noqa: E402

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


@pytest.fixture(scope="session")
def tiny_bench(checkpoint):
    """`moetune bench` through the console script on the tiny qwen3_moe against transformers, small sizes,
    one thread: one launch (a CompletedProcess, read-only) whose table (tests/cli/test_bench.py) and
    kernel-variant header (tests/kernels/test_cpu_isa.py) are each checked by their own test."""
    from tests.cli_run import moetune

    return moetune("bench", "--model", str(checkpoint("qwen3_moe")), "--against", "transformers",
                   "--prefill-len", "16", "--decode-steps", "2", "--threads", "1")
