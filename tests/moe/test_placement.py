"""Placement policies, EPLB (DeepSeek's published example reproduced exactly), files, bad input."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.errors import MoetuneError
from moetune.moe.eplb import eplb_layer
from moetune.moe.placement import (Placement, check_ep, make_placement, read_loads, read_placement, sglang_json,
                                   write_placement)
from tests.cli_run import assert_one_line_error, moetune

# github.com/deepseek-ai/EPLB README: 2 layers × 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs
README_LOADS = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def test_eplb_reproduces_deepseeks_readme_example_through_the_cli(tmp_path):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(README_LOADS))
    out = tmp_path / "placement.json"
    result = moetune("placement", "--loads", str(loads), "--ep-size", "8", "--redundant-experts", "4",
                     "--nodes", "2", "--groups", "4", "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert [layer["physical_to_logical"] for layer in data["layers"]] == README_PHY2LOG
    assert data["slots_per_rank"] == 2 and len(data["layers"][0]["rank_load"]) == 8
    sglang = json.loads((tmp_path / "placement.sglang.json").read_text())
    assert sglang == {"physical_to_logical_map": README_PHY2LOG}
    back = read_placement(out)
    assert back.phy2log.tolist() == README_PHY2LOG and back.ep_size == 8


loads_strategy = st.integers(1, 4).flatmap(lambda groups: st.tuples(
    st.just(groups),
    st.integers(1, 4).map(lambda per: per * groups),  # E, a multiple of the groups
)).flatmap(lambda ge: st.tuples(
    st.just(ge[0]), st.lists(st.integers(0, 1000), min_size=ge[1], max_size=ge[1]),
    st.sampled_from([d for d in range(1, ge[1] + 1) if ge[1] % d == 0]),  # a rank count dividing E
    st.integers(0, 3),  # redundant per rank
))


@settings(max_examples=300, deadline=None)
@given(loads_strategy)
def test_eplb_properties(case):
    groups, loads, R, extra_per_rank = case
    E, P = len(loads), len(loads) + extra_per_rank * R
    table = np.array([loads], dtype=float)
    placed = make_placement("eplb", E, R, [0], P - E, table, groups, 1)
    row = placed.phy2log[0]
    assert row.shape == (P,) and placed.slots_per_rank * R == P
    assert set(row.tolist()) == set(range(E))  # every logical expert has at least one replica
    peak = placed.rank_loads(table).max()
    assert peak <= make_placement("contiguous", E, R, [0]).rank_loads(table).max() + 1e-9  # no replicas, in order


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(1, 4), st.integers(0, 5), st.sampled_from(["contiguous", "round_robin"]))
def test_simple_policies_cover_every_expert(E, R, N, policy):
    if (E + N) % R or R > E + N:
        with pytest.raises(MoetuneError):
            make_placement(policy, E, R, [1], N)
        return
    placed = make_placement(policy, E, R, [1], N)
    assert sorted(set(placed.row(1).tolist())) == list(range(E))
    sm = placed.slot_map(1)
    if not sm.identity:  # the slot map sends every replica index to a slot holding that expert
        for e in range(E):
            slots = sm.replicas[e, : sm.counts[e]].tolist()
            assert all(placed.row(1)[s] == e for s in slots)


def test_round_robin_deals_slots_over_ranks():
    assert make_placement("round_robin", 4, 2, [0]).phy2log[0].tolist() == [0, 2, 1, 3]
    assert make_placement("contiguous", 4, 2, [0], 2).phy2log[0].tolist() == [0, 0, 1, 1, 2, 3]


def test_replicas_split_copies_by_token_index():
    placed = make_placement("contiguous", 3, 1, [0], 1)  # expert 0 twice: slots 0 and 1
    ids = np.array([[0], [0], [0], [2]])
    import torch

    assert placed.slot_map(0).physical(torch.tensor(ids)).view(-1).tolist() == [0, 1, 0, 3]


def test_hierarchical_keeps_groups_on_one_node():
    loads = np.random.default_rng(1).integers(1, 50, 16).astype(float)
    row = eplb_layer(loads, 24, 4, 2, 4)  # 4 groups of 4 experts, 2 nodes of 2 ranks
    for node in range(2):
        groups = {e // 4 for e in row[node * 12 : (node + 1) * 12]}
        assert len(groups) == 2


def test_sglang_map_covers_dense_layers_trivially():
    placed = Placement(4, 2, (1, 2), np.array([[1, 0, 3, 2], [0, 1, 2, 3]]))
    rows = sglang_json(placed, num_layers=3)["physical_to_logical_map"]
    assert rows == [[0, 1, 2, 3], [1, 0, 3, 2], [0, 1, 2, 3]]


@pytest.mark.parametrize("E, R, N, fragment", [
    (6, 4, 0, "does not divide the model's 6 experts"),
    (6, 4, 1, r"6 experts \+ 1 redundant"),
    (4, 8, 0, "larger than the 4 physical expert slots"),
    (4, 0, 0, "at least 1"),
])
def test_bad_sizes(E, R, N, fragment):
    with pytest.raises(MoetuneError, match=fragment):
        check_ep(E, R, N)


def test_files_for_another_model_or_ep_size_are_refused(tmp_path):
    placed = make_placement("contiguous", 4, 2, [0, 1], model_type="mixtral")
    write_placement(placed, tmp_path / "p.json")
    back = read_placement(tmp_path / "p.json")
    with pytest.raises(MoetuneError, match="not 4"):
        back.check_for(4, [0, 1], 4, "mixtral")
    with pytest.raises(MoetuneError, match="qwen2_moe"):
        back.check_for(4, [0, 1], 2, "qwen2_moe")
    with pytest.raises(MoetuneError, match="8 experts"):
        back.check_for(8, [0, 1], 2, None)


@pytest.mark.parametrize("text", ["[]", "[[1, 2], [3]]", "[[1, -2]]", "{\"a\": 1}", "[[1, \"x\"]]", "not json"])
def test_bad_loads_files(tmp_path, text):
    path = tmp_path / "loads.json"
    path.write_text(text)
    with pytest.raises(MoetuneError, match="loads file"):
        read_loads(path)


def test_placement_cli_bad_input(tmp_path):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(README_LOADS))
    out = str(tmp_path / "p.json")
    assert_one_line_error(moetune("placement", "--loads", str(loads), "--ep-size", "5", "--out", out),
                          "--ep-size 5 does not divide")
    assert_one_line_error(moetune("placement", "--loads", str(loads), "--ep-size", "32", "--out", out),
                          "larger than the 12 physical")
    assert_one_line_error(moetune("placement", "--ep-size", "2", "--out", out), "exactly one")
    assert_one_line_error(moetune("placement", "--loads", str(loads), "--ep-size", "4", "--groups", "5",
                                  "--out", out), "--groups 5")
    assert not (tmp_path / "p.json").exists()
