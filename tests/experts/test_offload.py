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


MIX = ("int8", "fp32", "int8", "bf16", "fp32", "int8", "int8")  # E = 7: three formats, interleaved
CPU_MIX = ("int8", "fp32", "int8", "int8", "fp32", "int8", "fp32")  # the CPU kernels take no bf16 (and D = 48)


def _mixed(path, store_factory=None, backend="torch"):
    from moetune.quant.table import PrecisionTable

    table = PrecisionTable({i: CPU_MIX if backend == "cpu" else MIX for i in read_spec(path).moe_layers})
    return load_model(path, kernel_backend=backend, precision=table, store_factory=store_factory)


def test_region_sizes_share_the_capacity_by_format():
    from moetune.experts.offload import region_sizes

    assert region_sizes(3, [4, 2, 1]) == [1, 1, 1]
    assert region_sizes(5, [4, 2, 1]) == [3, 1, 1]
    assert region_sizes(7, [4, 2, 1]) == [4, 2, 1]
    assert region_sizes(4, [1, 6]) == [1, 3]
    assert region_sizes(6, [6]) == [6]
    for C in range(3, 8):
        sizes = region_sizes(C, [4, 2, 1])
        assert sum(sizes) == C and all(1 <= s <= n for s, n in zip(sizes, [4, 2, 1]))


@pytest.mark.parametrize("capacity,policy,depth,tier,backend", [
    (3, "lru", 1, "host", "torch"), (5, "score", 2, "disk", "torch"), (4, "lfu", 1, "host", "cpu"),
])
def test_offloaded_layers_mixing_formats_give_the_resident_mix_tokens(resident, capacity, policy, depth, tier,
                                                                      backend, tmp_path):
    path, _ = resident
    want = _greedy(_mixed(path, backend=backend))
    settings = OffloadSettings(capacity, policy, tier, str(tmp_path / "blobs") if tier == "disk" else None, depth)
    model = _mixed(path, lambda layers, spec: OffloadingExpertStore(layers, 3, settings, "cpu"), backend)
    cache = model.experts._caches[read_spec(path).moe_layers[0]]
    assert len(cache.regions) == (2 if backend == "cpu" else 3) and cache.regions[-1].stop == capacity
    assert _greedy(model) == want
    stats = model.experts.stats()
    assert sum(s["misses"] for s in stats.values()) > 0 and sum(s["hits"] for s in stats.values()) > 0
    mix = CPU_MIX if backend == "cpu" else MIX
    for c in model.experts._caches.values():  # every resident expert sits in its own format's region
        held = [set() for _ in c.regions]
        for slot, e in enumerate(c.expert_in):
            if e >= 0:
                g = next(g for g, r in enumerate(c.regions) if r.start <= slot < r.stop)
                held[g].add(mix[e])
        assert all(len(names) <= 1 for names in held) and sum(map(len, held)) == len(set().union(*held))
    model.experts.close()


def test_offloading_refuses_replicas_and_too_few_slots_for_the_formats(resident):
    path, _ = resident
    from moetune.moe.placement import make_placement

    spec = read_spec(path)
    placement = make_placement("contiguous", 7, 1, spec.moe_layers, 1)
    settings = OffloadSettings(3, "lru", "host", None, 0)
    with pytest.raises(OffloadError, match="offloading under expert parallelism or with replicas"):
        load_model(path, kernel_backend="torch", placement=placement,
                   store_factory=lambda layers, s: OffloadingExpertStore(layers, 3, settings, "cpu"))
    from moetune.quant.table import PrecisionTable

    table = PrecisionTable({i: ("int8", "fp32", "bf16", "fp16", "fp8", "int8", "int8") for i in spec.moe_layers})
    with pytest.raises(OffloadError, match="capacity 3 experts per layer is below the 5 expert formats"):
        load_model(path, kernel_backend="torch", precision=table,
                   store_factory=lambda layers, s: OffloadingExpertStore(layers, 3, settings, "cpu"))
