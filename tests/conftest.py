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


BENCH_ARGS = ("--prefill-len", "16", "--decode-steps", "2", "--threads", "1")


@pytest.fixture(scope="session")
def tiny_benches(checkpoint, tmp_path_factory):
    """`moetune bench` through the console script on the tiny qwen3_moe, small sizes, one thread, launched
    together (one core each): (fp32 against transformers, int8 experts and dense projections by a recipe).
    Read-only CompletedProcesses; each test checks its own part."""
    from tests.cli_run import moetune_each

    path = checkpoint("qwen3_moe")
    recipe = tmp_path_factory.mktemp("bench_int8") / "q.yaml"
    recipe.write_text(f"model:\n  path: {path}\nquant:\n  experts: int8\n  dense: int8\n")
    return tuple(moetune_each(("bench", "--model", str(path), "--against", "transformers", *BENCH_ARGS),
                              ("bench", "--recipe", str(recipe), *BENCH_ARGS)))


@pytest.fixture(scope="session")
def tiny_bench(tiny_benches):
    """The fp32 launch of `tiny_benches`, whose table (tests/cli/test_bench.py) and kernel-variant header
    (tests/kernels/test_cpu_isa.py) are each checked by their own test."""
    return tiny_benches[0]


@pytest.fixture(scope="session")
def tiny_bench_int8(tiny_benches):
    """The int8 launch of `tiny_benches` (experts and dense projections int8: tests/cli/test_bench.py)."""
    return tiny_benches[1]
