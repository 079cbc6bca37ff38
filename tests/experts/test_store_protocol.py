"""Every expert store implements the whole `ExpertStore` protocol (callers never probe a store with
hasattr), and the resident store's no-op members behave as a store with nothing to move."""

import inspect

import torch

from moetune.experts.offload import OffloadingExpertStore, OffloadSettings
from moetune.experts.store import ExpertStore, ExpertWeights, ResidentExpertStore


def _members() -> set[str]:
    declared = {name for name, v in vars(ExpertStore).items() if inspect.isfunction(v) and not name.startswith("_")}
    return declared | set(ExpertStore.__annotations__)


def _layers(E=4, I=8, D=16) -> dict[int, ExpertWeights]:
    g = torch.Generator().manual_seed(0)
    return {i: ExpertWeights.dense(torch.randn(E, 2 * I, D, generator=g), torch.randn(E, D, I, generator=g))
            for i in (1, 3)}


def test_the_protocol_declares_what_callers_use():
    assert _members() >= {"resident", "settings", "acquire", "prefetch", "layers", "nbytes", "bind_routers",
                          "stats", "reset_stats", "drain"}


def test_every_store_has_every_member():
    from moetune.bench.throughput import RoutedExperts

    resident = ResidentExpertStore(_layers())
    offload = OffloadingExpertStore(_layers(), 2, OffloadSettings(2, prefetch_depth=0))
    model = type("Model", (), {"layers": [], "experts": resident})()  # RoutedExperts wraps model.experts
    try:
        for store in (resident, offload, RoutedExperts(model)):
            missing = {m for m in _members() if not hasattr(store, m)}
            assert not missing, f"{type(store).__name__} lacks {sorted(missing)}"
    finally:
        offload.close()


def test_the_resident_store_moves_nothing():
    store = ResidentExpertStore(_layers())
    store.bind_routers({1: lambda h: h})
    store.drain()
    store.reset_stats()
    assert store.resident and store.settings is None and store.stats() == {}
    assert store.acquire(3, torch.zeros(2, 2, dtype=torch.int64)) is store.weights(3)


def test_the_offloading_store_counts_and_resets():
    store = OffloadingExpertStore(_layers(), 2, OffloadSettings(2, prefetch_depth=0))
    try:
        store.acquire(1, torch.tensor([[0, 3], [2, 3]]))
        assert not store.resident and store.settings.capacity == 2
        assert sum(row["misses"] + row["hits"] for row in store.stats().values()) > 0
        store.drain()
        store.reset_stats()
        assert all(row["misses"] == row["hits"] == 0 for row in store.stats().values())
    finally:
        store.close()
