"""Fused router kernel vs its twin (moetune.moe.router.select_experts).

Tolerance: ids must match exactly (random logits, no ties); weights fp32 atol 1e-6 (softmax /
sigmoid / division reassociation only, values ≤ scaling factor).
"""

import pytest
import torch

from moetune.kernels.reference import select_experts_ref
from moetune.kernels.router import select_experts
from moetune.spec import RouterSpec

SPECS = {
    "softmax-renorm": (10, RouterSpec("softmax", 2, True)),
    "softmax-k4": (6, RouterSpec("softmax", 4, False)),
    "softmax-k1": (6, RouterSpec("softmax", 1, True)),
    "sigmoid-bias-groups": (12, RouterSpec("sigmoid", 4, True, n_group=4, topk_group=2, has_selection_bias=True,
                                           scaling_factor=2.5)),
    "sigmoid-group-size-1": (6, RouterSpec("sigmoid", 2, True, n_group=6, topk_group=3, has_selection_bias=True)),
    "sigmoid-no-renorm": (10, RouterSpec("sigmoid", 2, False, scaling_factor=1.5)),
}


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_router_matches_twin(name, T):
    E, spec = SPECS[name]
    g = torch.Generator().manual_seed(T)
    logits = torch.randn(T, E, generator=g) * 2  # [T, E]
    bias = torch.rand(E, generator=g) * 0.3 if spec.has_selection_bias else None
    w, ids = select_experts(logits, spec, bias)
    rw, rids = select_experts_ref(logits, spec, bias)
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, atol=1e-6, rtol=0)


def test_bias_changes_choice_not_weights():
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]])
    spec = RouterSpec("sigmoid", 1, False)
    bias = torch.tensor([10.0, 0, 0, 0, 0, 0])
    w, ids = select_experts(logits, spec, bias)
    assert ids.item() == 0
    torch.testing.assert_close(w, torch.sigmoid(logits[:, :1]))
