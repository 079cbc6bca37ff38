"""EP placement and byte accounting on a hand-made routing."""

import numpy as np
import pytest

from moetune.errors import MoetuneError
from moetune.moe.placement import check_ep
from moetune.profile.ep import contiguous_layout, step_traffic

# E=4 on R=2: experts 0,1 on rank 0; 2,3 on rank 1. Tokens 0,2 start on rank 0; 1,3 on rank 1.
TOPK = np.array([[0, 2], [1, 3], [2, 3], [0, 1]])  # [T=4, K=2]
ROW = 8 * 4  # D=8 fp32


def test_contiguous_placement():
    assert contiguous_layout(8, 4, 1).placement.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_bytes_by_locality_one_rank_per_node():
    t = step_traffic(TOPK, contiguous_layout(4, 2, 1), ROW)
    # same rank: (t0, e0), (t1, e3); moved: the other 6 copies, each there and back.
    assert t.same_rank == 2 * 2 * ROW
    assert t.inter_node == 6 * 2 * ROW
    assert t.intra_node == 0
    assert t.copies_in.tolist() == [4, 4]
    # rank 0 sends t2's two copies and t0's e2 copy (3 dispatches) and combines t1-e1, t3-e0, t3-e1 (3)
    assert t.send_bytes.tolist() == [6 * ROW, 6 * ROW]


def test_same_routing_with_both_ranks_on_one_node():
    t = step_traffic(TOPK, contiguous_layout(4, 2, 2), ROW)
    assert (t.same_rank, t.intra_node, t.inter_node) == (2 * 2 * ROW, 6 * 2 * ROW, 0)


def test_one_rank_moves_nothing():
    t = step_traffic(TOPK, contiguous_layout(4, 1, 1), ROW)
    assert (t.intra_node, t.inter_node) == (0, 0)
    assert t.same_rank == TOPK.size * 2 * ROW


def test_a_skewed_rank_receives_more():
    t = step_traffic(np.array([[0, 1], [0, 2], [1, 3]]), contiguous_layout(4, 2, 1), ROW)
    assert t.copies_in.tolist() == [4, 2]


@pytest.mark.parametrize("ep, rpn, fragment", [(3, 1, "--ep-size 3"), (0, 1, "--ep-size 0"), (4, 3, "--ranks-per-node 3")])
def test_bad_parallel_sizes_are_user_errors(ep, rpn, fragment):
    with pytest.raises(MoetuneError, match=fragment):
        check_ep(16, ep, ranks_per_node=rpn)


def test_a_placement_with_replicas_splits_copies_by_each_tokens_index_on_its_rank():
    from moetune.moe.placement import Placement
    from moetune.profile.ep import placement_layout

    # slots [e0, e1, e0 | e2, e3, e1]: e0 on slots 0, 2 (rank 0), e1 on slots 1 (rank 0) and 5 (rank 1)
    p = Placement(4, 2, (0,), np.array([[0, 1, 0, 2, 3, 1]]))
    layout = placement_layout(p, 4, 2, 1)
    ids = np.array([[1, 2], [1, 3], [1, 0]])  # [T=3, K=2]
    origin = np.array([0, 0, 1])  # tokens 0, 1 on rank 0 (local 0, 1); token 2 on rank 1 (local 0)
    t = step_traffic(ids, layout, ROW, origin, layer=0)
    # e1 copies: local 0 → slot 1 (rank 0), local 1 → slot 5 (rank 1), rank 1's local 0 → slot 1 (rank 0)
    assert t.copies_in.tolist() == [3, 3]
    # moved: (t0, e2) 0→1, (t1, e1) 0→1, (t1, e3) 0→1, (t2, e1) 1→0, (t2, e0) 1→0 → 5 copies
    assert t.same_rank == 1 * 2 * ROW and t.inter_node == 5 * 2 * ROW


def test_the_measured_send_matrix_splits_bytes_by_locality():
    from moetune.profile.ranks.tables import locality_rows, send_matrix

    counts = np.array([[1, 2, 0, 3], [4, 0, 5, 6]])  # [R=2, P=4] copies each rank sent to each slot
    S = send_matrix(counts, 2)
    assert S.tolist() == [[3, 3], [4, 11]]
    assert locality_rows(S, 0, np.array([0, 1])) == (6, 0, 3 + 4)  # keeps 3 both ways; sends 3, returns 4
    assert locality_rows(S, 1, np.array([0, 0])) == (22, 4 + 3, 0)
