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
