"""Offloading changes nothing in the output: greedy tokens under any capacity / policy / depth / tier
equal the fully resident model, while the counters show the cache really worked."""

import numpy as np
import pytest
import torch

from moetune.config import EngineConfig
from moetune.engine.generate import Generator
from moetune.engine.sampling import SamplingParams
from moetune.experts.offload import OffloadError, OffloadingExpertStore, OffloadSettings
from moetune.model.loader import load_model
from moetune.model.validate import read_spec

PROMPTS = [[5, 17, 40, 99, 3, 250, 7], [8, 9, 10], [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210]]


def _greedy(model, n=12):
    gen = Generator(model, None, frozenset(), EngineConfig(max_num_seqs=4, prefix_caching=False))
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [c.token_ids for c in gen.generate(PROMPTS, params)]


def _offloaded(path, capacity, policy="lru", tier="host", depth=1, d=None, warm=None):
    top_k = read_spec(path).moe.router.top_k
    settings = OffloadSettings(capacity, policy, tier, str(d) if d else None, depth)
    return load_model(path, kernel_backend="torch",
                      store_factory=lambda layers, spec: OffloadingExpertStore(layers, top_k, settings, "cpu", warm))


@pytest.fixture(scope="module")
def resident(checkpoint):
    path = checkpoint("qwen3_moe", shard=False)  # E = 7, K = 3
    return path, _greedy(load_model(path, kernel_backend="torch"))


@pytest.mark.parametrize("capacity,policy,depth,tier", [
    (3, "lru", 0, "host"), (3, "lfu", 1, "host"), (4, "score", 2, "host"), (5, "lru", 3, "disk"),
    (3, "score", 1, "disk"), (7, "lfu", 0, "host"),
])
def test_greedy_tokens_equal_the_resident_model(resident, capacity, policy, depth, tier, tmp_path):
    path, want = resident
    model = _offloaded(path, capacity, policy, tier, depth, tmp_path / "blobs" if tier == "disk" else None)
    assert _greedy(model) == want
    stats = model.experts.stats()
    total_hits = sum(s["hits"] for s in stats.values())
    total_misses = sum(s["misses"] for s in stats.values())
    assert total_hits > 0
    if capacity == 7:
        assert total_misses == 0 and all(s["hit_rate"] == 1.0 for s in stats.values())
    else:
        assert total_misses > 0
        fetched = sum(s["bytes_disk" if tier == "disk" else "bytes_host"] for s in stats.values())
        assert fetched > 0
    if depth > 0:
        model.experts.drain()
        assert sum(model.experts.stats()[i]["prefetch_issued"] for i in stats) > 0
    assert model.experts.nbytes() < load_model(path, kernel_backend="torch").experts.nbytes() or capacity == 7
    model.experts.close()


def test_a_prefill_needing_more_experts_than_slots_uses_a_transient_buffer(resident):
    path, want = resident
    model = _offloaded(path, 3, depth=0)
    assert _greedy(model) == want
    assert sum(s["overflow_steps"] for s in model.experts.stats().values()) > 0  # prompts route to > 3 experts


def test_warm_start_puts_the_hot_experts_in_first(resident):
    path, _ = resident
    spec = read_spec(path)
    warm = np.zeros((len(spec.moe_layers), 7))
    warm[:, 6], warm[:, 4] = 10, 5
    model = _offloaded(path, 3, depth=0, warm=warm)
    cache = model.experts._caches[spec.moe_layers[0]]
    assert cache.expert_in == [6, 4, 0]


def test_bad_settings_are_one_line(resident, tmp_path):
    path, _ = resident
    with pytest.raises(OffloadError, match="capacity 2 experts per layer is below top-k 3"):
        _offloaded(path, 2)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OffloadError, match=f"offload directory '{blocker}' cannot be used"):
        _offloaded(path, 3, tier="disk", d=blocker)


def test_the_disk_tier_reads_with_real_io_and_drops_its_pages(resident, tmp_path, monkeypatch):
    import os

    path, want = resident
    calls = {"preadv": 0, "fadvise": 0}
    real_preadv, real_fadvise = os.preadv, os.posix_fadvise

    def preadv(*a):
        calls["preadv"] += 1
        return real_preadv(*a)

    def fadvise(fd, off, n, advice):
        calls["fadvise"] += advice == os.POSIX_FADV_DONTNEED
        return real_fadvise(fd, off, n, advice)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    model = _offloaded(path, 3, tier="disk", depth=0, d=tmp_path / "blobs")
    assert _greedy(model, 4) == [t[:4] for t in want]
    assert calls["preadv"] > 0 and calls["fadvise"] >= calls["preadv"]
    assert sorted(p.name for p in (tmp_path / "blobs").iterdir()) == [f"layer{i}.safetensors"
                                                                       for i in sorted(read_spec(path).moe_layers)]
