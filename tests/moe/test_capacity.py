"""Capacity policies: exact drop and reroute counts on a hand-made routing."""

import torch

from moetune.moe.capacity import apply_capacity, capacity_of

# 4 tokens, K = 2, E = 4; expert 0 is chosen by every token (4 copies), capacity 2
IDS = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])
W = torch.tensor([[0.6, 0.4], [0.9, 0.1], [0.5, 0.5], [0.7, 0.3]])
SCORES = torch.tensor([[4.0, 3.0, 2.0, 1.0],   # token 0 prefers 0, 1, 2, 3
                       [4.0, 1.0, 3.0, 2.0],
                       [4.0, 3.0, 1.0, 2.0],
                       [2.0, 1.0, 3.0, 4.0]])


def test_capacity_formula():
    assert capacity_of(1.0, 4, 2, 4) == 2 and capacity_of(1.25, 4, 2, 4) == 3


def test_drop_keeps_the_heaviest_copies():
    out = apply_capacity(IDS, W, SCORES, 2, "drop")
    # expert 0 copies by weight: t1 0.9, t0 0.6, t2 0.5, t3 0.3 → t2 and t3 dropped; expert 1: 2 copies fit
    assert out.dropped == 2 and out.rerouted == 0
    assert torch.allclose(out.topk_weights, torch.tensor([[0.6, 0.4], [0.9, 0.1], [0.0, 0.5], [0.7, 0.0]]))
    assert torch.equal(out.topk_ids, IDS)


def test_reroute_moves_overflow_to_the_next_best_expert_with_room():
    out = apply_capacity(IDS, W, SCORES, 2, "reroute")
    # t2's copy (0.5) first: prefers 0 (full), 1 (already its own choice), 3 (has 1 of 2) → 3
    # t3's copy (0.3): prefers 3 (its own), 2 (has t1's, 1 of 2) → 2
    assert out.rerouted == 2 and out.dropped == 0
    assert out.topk_ids.tolist() == [[0, 1], [0, 2], [3, 1], [3, 2]]
    assert torch.allclose(out.topk_weights, W)


def test_reroute_drops_when_nobody_has_room():
    out = apply_capacity(IDS, W, SCORES, 1, "reroute")
    # capacity 1: by weight, expert 0 keeps t1 (0.9), 3 keeps t3 (0.7), 1 keeps t2 (0.5, after t2's 0.5 to
    # expert 0, stable), 2 keeps t1 (0.1): every expert is full, so the 4 overflow copies are dropped
    assert out.rerouted == 0 and out.dropped == 4
    assert (out.topk_weights > 0).tolist() == [[False, False], [True, True], [False, True], [True, False]]


def test_none_changes_nothing():
    out = apply_capacity(IDS, W, SCORES, 1, "none")
    assert out.dropped == out.rerouted == 0 and torch.equal(out.topk_ids, IDS)


def test_buffer_keeps_every_copy_and_marks_the_overflow_for_the_second_pass():
    out = apply_capacity(IDS, W, SCORES, 2, "buffer")
    # the copies drop would drop (t2's and t3's of expert 0) are kept, weights and all, and marked
    assert out.buffered == 2 and out.dropped == out.rerouted == 0
    assert torch.equal(out.topk_ids, IDS) and torch.equal(out.topk_weights, W)
    assert out.over.tolist() == [[False, False], [False, False], [True, False], [False, True]]
    assert torch.equal(apply_capacity(IDS, W, SCORES, 2, "drop").over, out.over)
