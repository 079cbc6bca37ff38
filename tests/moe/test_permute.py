import pytest
import torch

from moetune.moe.permute import permute
from moetune.moe.unpermute import unpermute


def _check_permutation(x, ids, E):
    T, K = ids.shape
    out = permute(x, ids, E)
    assert sorted(out.sorted_copy_ids.tolist()) == list(range(T * K))  # each copy exactly once
    assert out.counts.tolist() == torch.bincount(ids.reshape(-1), minlength=E).tolist()
    for e in range(E):  # each segment holds exactly the copies routed to e
        seg = out.sorted_copy_ids[out.offsets[e]:out.offsets[e + 1]]
        assert (ids.reshape(-1)[seg] == e).all()
        torch.testing.assert_close(out.x_sorted[out.offsets[e]:out.offsets[e + 1]], x[seg // K])
    return out


@pytest.mark.parametrize("T,K,E", [(1, 1, 3), (1, 2, 4), (7, 2, 5), (33, 4, 6)])
def test_every_copy_appears_once_in_its_experts_segment(T, K, E):
    x = torch.randn(T, 8)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    _check_permutation(x, ids, E)


def test_an_empty_expert_has_an_empty_segment():
    ids = torch.tensor([[0, 2], [2, 0], [0, 2]])
    out = _check_permutation(torch.randn(3, 4), ids, 4)
    assert out.counts.tolist() == [3, 0, 3, 0]
    assert out.offsets.tolist() == [0, 3, 3, 6, 6]


def test_all_tokens_to_one_expert():
    ids = torch.full((10, 1), 3)
    out = _check_permutation(torch.randn(10, 4), ids, 5)
    assert out.counts.tolist() == [0, 0, 0, 10, 0]


@pytest.mark.parametrize("T,K", [(1, 1), (1, 3), (9, 2)])
def test_unpermute_of_permute_is_identity(T, K):
    E = 5
    x = torch.randn(T, 6)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    weights = torch.full((T, K), 1.0 / K)
    out = permute(x, ids, E)
    torch.testing.assert_close(unpermute(out.x_sorted, out.sorted_copy_ids, weights), x)


def test_unpermute_weights_each_copy_and_adds_the_shared_expert():
    x = torch.randn(4, 3)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [1, 0]])
    w = torch.rand(4, 2)
    out = permute(x, ids, 3)
    y_sorted = out.x_sorted * (1 + out.sorted_copy_ids % 2)[:, None].float()  # copy k=1 doubled
    shared = torch.randn(4, 3)
    got = unpermute(y_sorted, out.sorted_copy_ids, w, shared)
    torch.testing.assert_close(got, x * (w[:, :1] + 2 * w[:, 1:]) + shared)
