import pytest
import torch

from moetune.spec import RouterSpec
from moetune.moe.router import route, select_experts


def test_softmax_topk_renormalised_weights_sum_to_one():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 4.0]])
    w, ids = select_experts(logits, RouterSpec(top_k=2, renormalize=True))
    assert ids.tolist() == [[1, 2], [2, 3]]
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    p = logits.softmax(-1)
    torch.testing.assert_close(w[0], p[0, [1, 2]] / p[0, [1, 2]].sum())


def test_without_renormalise_weights_are_the_softmax_probabilities():
    logits = torch.randn(5, 6)
    w, ids = select_experts(logits, RouterSpec(top_k=3, renormalize=False))
    torch.testing.assert_close(w, logits.softmax(-1).gather(1, ids))
    assert (w.sum(-1) < 1).all()


def test_ties_give_k_distinct_experts_deterministically():
    logits = torch.zeros(3, 8)  # every expert ties
    w1, ids1 = select_experts(logits, RouterSpec(top_k=4))
    w2, ids2 = select_experts(logits, RouterSpec(top_k=4))
    assert torch.equal(ids1, ids2)
    for row in ids1.tolist():
        assert len(set(row)) == 4
    torch.testing.assert_close(w1, torch.full((3, 4), 0.25))


def test_selection_bias_changes_choice_but_not_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    spec = RouterSpec(score="sigmoid", top_k=2, renormalize=False, has_selection_bias=True)
    _, ids = select_experts(logits, spec)
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    w, ids_b = select_experts(logits, spec, bias)
    assert ids.tolist() == [[0, 1]] and ids_b.tolist() == [[3, 0]]
    torch.testing.assert_close(w, logits.sigmoid()[:, [3, 0]])  # unbiased scores


def test_group_limited_selection_only_picks_from_top_groups():
    # 4 groups of 2 experts; group scores (sum of top-2): g0=0.2, g1=1.9, g2=1.0, g3=1.7
    scores = torch.tensor([[0.1, 0.1, 0.95, 0.95, 0.5, 0.5, 0.99, 0.71]])
    logits = torch.logit(scores)
    spec = RouterSpec(score="sigmoid", top_k=2, n_group=4, topk_group=2, renormalize=True)
    w, ids = select_experts(logits, spec)
    assert sorted(ids[0].tolist()) == [2, 6]  # best of groups 1 and 3 (0.95 vs 0.99 and 0.95)
    torch.testing.assert_close(w.sum(-1), torch.ones(1))
    # without groups, expert 3 (0.95) would beat nothing else here either; make groups matter:
    spec_one = RouterSpec(score="sigmoid", top_k=2, n_group=4, topk_group=1)
    _, ids_one = select_experts(logits, spec_one)
    assert sorted(ids_one[0].tolist()) == [2, 3]  # group 1 only


def test_scaling_factor_multiplies_weights():
    logits = torch.randn(4, 8)
    base, _ = select_experts(logits, RouterSpec(score="sigmoid", top_k=2))
    scaled, _ = select_experts(logits, RouterSpec(score="sigmoid", top_k=2, scaling_factor=2.5))
    torch.testing.assert_close(scaled, base * 2.5)


@pytest.mark.parametrize("T", [1, 5])
def test_route_computes_gate_logits_in_fp32(T):
    x = torch.randn(T, 16, dtype=torch.bfloat16)
    gate = torch.randn(6, 16)
    out = route(x, gate, RouterSpec(top_k=2), None)
    assert out.logits.dtype == torch.float32 and out.logits.shape == (T, 6)
    assert out.topk_ids.shape == (T, 2) and out.topk_weights.dtype == torch.float32
