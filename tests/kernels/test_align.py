"""Align kernel vs its twin: every buffer equal, element for element (integer outputs)."""

import pytest
import torch

from moetune.kernels.align import align_block_size
from moetune.kernels.reference import align_block_size_ref
from tests.kernels.helpers import all_to_one, random_topk_ids


def _assert_same(a, b):
    for name, x, y in zip(a._fields, a, b):
        if torch.is_tensor(x):
            assert torch.equal(x, y), name
        else:
            assert x == y, name


def _assert_valid(layout, topk_ids, E):
    T, K = topk_ids.shape
    used = int(layout.num_tokens_post_padded)
    ids = layout.sorted_token_ids
    real = ids[:used][ids[:used] < T * K]
    assert torch.equal(real.sort().values, torch.arange(T * K, dtype=torch.int32))  # each copy once
    assert used % layout.block_m == 0 and bool((ids[used:] == T * K).all())
    blocks = layout.expert_ids[: used // layout.block_m].long()
    rows = ids[:used].view(-1, layout.block_m).long()
    flat = topk_ids.reshape(-1)
    for b, e in enumerate(blocks.tolist()):
        copies = rows[b][rows[b] < T * K]
        assert bool((flat[copies] == e).all())


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("E", [6, 10])
@pytest.mark.parametrize("K", [1, 2, 4])
def test_align_matches_twin(T, E, K):
    topk_ids = random_topk_ids(T, E, K, seed=T * E + K, avoid=E - 2)  # expert E-2 stays empty
    layout = align_block_size(topk_ids, E, 16)
    _assert_same(layout, align_block_size_ref(topk_ids, E, 16))
    _assert_valid(layout, topk_ids, E)
    assert layout.counts[E - 2] == 0


@pytest.mark.parametrize("block_m", [16, 32])
def test_align_all_tokens_to_one_expert(block_m):
    topk_ids = all_to_one(33, 6, 2)
    layout = align_block_size(topk_ids, 6, block_m)
    _assert_same(layout, align_block_size_ref(topk_ids, 6, block_m))
    assert layout.counts[3] == 33


def test_align_expert_map_marks_remote_blocks():
    topk_ids = random_topk_ids(33, 6, 2, seed=1)
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3])
    layout = align_block_size(topk_ids, 6, 16, expert_map)
    _assert_same(layout, align_block_size_ref(topk_ids, 6, 16, expert_map))
    plain = align_block_size(topk_ids, 6, 16)
    used = int(plain.num_tokens_post_padded) // 16
    expected = expert_map[plain.expert_ids[:used].long()].to(torch.int32)
    assert torch.equal(layout.expert_ids[:used], expected)


def test_align_many_chunks():
    """More copies than one chunk: the per-chunk prefix must keep the order stable."""
    topk_ids = random_topk_ids(300, 10, 2, seed=3)
    _assert_same(align_block_size(topk_ids, 10, 16), align_block_size_ref(topk_ids, 10, 16))
