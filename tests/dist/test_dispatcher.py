"""AllToAllDispatcher over gloo: uneven splits, a rank that receives nothing, a rank that sends nothing."""

import functools

import pytest
import torch

from moetune.engine.ep_launch import launch
from tests.dist import jobs

ROW = 4 * 4  # D = 4 fp32


def run(slot_ids, num_slots):
    return launch(functools.partial(jobs.dispatch_roundtrip, slot_ids, num_slots), len(slot_ids),
                  torch.device("cpu"), timeout_s=60)


def test_uneven_splits_and_a_rank_that_receives_nothing():
    # P = 4 slots, 2 per rank; every copy goes to rank 0's slots 0 and 1: rank 1 receives nothing
    every = run([[[0, 1], [1, 0], [0, 1]], [[1, 0]]], 4)
    assert [r["exact"] for r in every] == [True, True]
    assert every[0]["received"] == 8 and every[1]["received"] == 0
    assert every[0]["offsets"] == [0, 4, 8] and every[1]["offsets"] == [0, 0, 0]
    assert every[0]["dispatch_bytes"] == 0 and every[1]["dispatch_bytes"] == 2 * ROW  # rank 0 keeps its own rows
    assert every[0]["combine_bytes"] == 2 * ROW and every[1]["combine_bytes"] == 0


def test_three_ranks_one_sending_nothing():
    every = run([[[0, 5], [2, 3], [4, 1], [5, 5]], [], [[3, 2]]], 6)
    assert all(r["exact"] for r in every)
    assert [r["received"] for r in every] == [2, 4, 4]
    assert every[1]["dispatch_bytes"] == 0 and every[1]["combine_bytes"] == 4 * ROW
