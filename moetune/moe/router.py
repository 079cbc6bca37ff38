"""Phase `router`: gate GEMM → scores → (group-limited, bias-shifted) top-k → renormalise → scale.

Weights always come from the unbiased scores; the selection bias (DeepSeek's
`e_score_correction_bias`) only changes which experts win.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from moetune.kernels.reference import select_experts_ref as select_experts
from moetune.spec import RouterSpec


class RouterOutput(NamedTuple):
    topk_weights: torch.Tensor  # [T, K] fp32
    topk_ids: torch.Tensor  # [T, K] int64, logical expert ids
    logits: torch.Tensor  # [T, E] fp32


def route(x: torch.Tensor, gate_weight: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None,
          select=None, gemm=None) -> RouterOutput:
    """Gate GEMM in fp32 (`gemm(x, gate_weight)`, default `router_logits`), then `select` (the torch
    twin `select_experts`, or a fused kernel with its signature)."""
    logits = (gemm or router_logits)(x, gate_weight)  # [T, E]
    weights, ids = (select or select_experts)(logits, spec, bias)
    return RouterOutput(weights, ids, logits)


def router_logits(x: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor:
    """x [T, D] @ gate_weight [E, D].T in fp32 → [T, E]."""
    return x.float() @ gate_weight.float().t()
