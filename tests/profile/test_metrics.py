"""Load metrics on hand-computed cases (docs/architecture.md §2: per layer first, then average)."""

import numpy as np
import pandas as pd
import pytest

from moetune.profile import metrics
from moetune.profile.analysis import load_summary


def test_load_stats_of_a_two_to_one_split():
    s = metrics.load_stats(np.array([2, 1]))
    assert s.mean == 1.5 and s.max == 2
    assert s.balancedness == pytest.approx(0.75)
    assert s.imbalance == pytest.approx(4 / 3)


def test_even_and_empty_loads_are_balanced():
    assert metrics.load_stats(np.array([3, 3, 3])).balancedness == 1.0
    assert metrics.load_stats(np.zeros(4)).balancedness == 1.0


def test_percentiles_of_expert_load():
    s = metrics.load_stats(np.arange(101))  # 0..100
    assert (s.p50, s.p95, s.p99) == (50, 95, 99)


def test_two_layers_two_ranks_one_rank_gets_twice_the_tokens():
    """Layer 0: rank 0 gets twice rank 1; layer 1: the other way round. Per layer 0.75, average 0.75;
    summing over layers first would wrongly give 1.0."""
    placement = np.array([0, 0, 1, 1])  # E=4 on R=2
    counts = np.array([[2, 2, 1, 1], [1, 1, 2, 2]])  # [L=2, E=4]
    ranks = metrics.rank_loads(counts, placement, 2)  # [L, R]
    assert ranks.tolist() == [[4, 2], [2, 4]]
    per_layer = metrics.per_layer_stats(ranks)
    assert [s.balancedness for s in per_layer] == [pytest.approx(0.75)] * 2
    assert metrics.mean_over_layers(per_layer, "balancedness") == pytest.approx(0.75)
    assert metrics.mean_over_layers(per_layer, "imbalance") == pytest.approx(4 / 3)
    assert metrics.load_stats(ranks.sum(axis=0)).balancedness == 1.0  # the trap the average avoids


def test_load_summary_from_a_table_over_several_steps():
    """Same case through the expert_load and ep_ranks tables (experts 0, 1 on rank 0; 2, 3 on rank 1):
    two steps per layer, 'always' twice the tokens."""
    rows, ranks = [], []
    for step in range(2):
        for layer, counts in ((0, [2, 2, 1, 1]), (1, [1, 1, 2, 2])):
            rows += [{"step": step, "kind": "decode", "layer": layer, "expert": e, "tokens": c}
                     for e, c in enumerate(counts)]
            ranks += [{"step": step, "kind": "decode", "layer": layer, "rank": r, "copies": sum(counts[2 * r: 2 * r + 2])}
                      for r in range(2)]
    tables = type("T", (), {"expert_load": pd.DataFrame(rows), "ep_ranks": pd.DataFrame(ranks)})()
    out = load_summary(tables, "decode")
    assert [r["rank"]["balancedness"] for r in out["per_layer"]] == [pytest.approx(0.75)] * 2
    assert out["mean_over_layers"]["rank_balancedness"] == pytest.approx(0.75)
    assert out["mean_over_layers"]["rank_balancedness"] != 1.0
    assert out["mean_over_layers"]["expert_balancedness"] == pytest.approx(1.5 / 2)


def test_hottest_experts_by_share_of_their_layer():
    hot = metrics.hottest_experts(np.array([[1, 1, 6], [5, 5, 0]]), layers=[3, 5], top=2)
    assert (hot[0]["layer"], hot[0]["expert"], hot[0]["share"]) == (3, 2, 0.75)
    assert hot[0]["x_fair_share"] == pytest.approx(2.25)
    assert hot[1]["share"] == 0.5


def test_padding_waste_of_the_block_align():
    counts = np.array([1, 64, 65, 0])
    assert metrics.padded_rows(counts, 64) == 64 + 64 + 128
    assert metrics.padding_waste(130, 256) == pytest.approx(126 / 256)
    assert metrics.padding_waste(0, 0) == 0.0


def test_capacity_and_drops():
    assert metrics.expert_capacity(tokens=4, top_k=2, num_experts=4, capacity_factor=1.0) == 2
    assert metrics.expert_capacity(4, 2, 4, 1.25) == 3  # ceil(2.5)
    assert metrics.dropped_copies(np.array([5, 1, 1, 1]), 2) == 3
    assert metrics.dropped_copies(np.array([5, 1, 1, 1]), 3) == 2
