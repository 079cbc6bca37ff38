"""Phase `router`: gate GEMM → scores → (group-limited, bias-shifted) top-k → renormalise → scale.

Weights always come from the unbiased scores; the selection bias (DeepSeek's
`e_score_correction_bias`) only changes which experts win.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from moetune.model.spec import RouterSpec


class RouterOutput(NamedTuple):
    topk_weights: torch.Tensor  # [T, K] fp32
    topk_ids: torch.Tensor  # [T, K] int64, logical expert ids
    logits: torch.Tensor  # [T, E] fp32


def route(x: torch.Tensor, gate_weight: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None,
          select=None) -> RouterOutput:
    """Gate GEMM in fp32, then `select` (the torch twin below, or a fused kernel with its signature)."""
    logits = x.float() @ gate_weight.float().t()  # [T, E]
    weights, ids = (select or select_experts)(logits, spec, bias)
    return RouterOutput(weights, ids, logits)


def select_experts(
    logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp32 → (topk_weights [T, K] fp32, topk_ids [T, K] int64). The torch twin of
    the fused router kernel."""
    scores = logits.softmax(dim=-1) if spec.score == "softmax" else logits.sigmoid()  # [T, E]
    choice = scores if bias is None else scores + bias.float()  # [T, E]
    if spec.n_group > 1 and spec.topk_group < spec.n_group:
        choice = _mask_to_top_groups(choice, spec.n_group, spec.topk_group)
    ids = torch.topk(choice, spec.top_k, dim=-1).indices  # [T, K]
    weights = scores.gather(1, ids)  # [T, K]
    if spec.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if spec.score == "sigmoid" else 0.0))
    if spec.scaling_factor != 1.0:
        weights = weights * spec.scaling_factor
    return weights, ids


def _mask_to_top_groups(choice: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """Keep experts of the `topk_group` groups whose two best experts score highest; -inf elsewhere."""
    T, E = choice.shape
    grouped = choice.view(T, n_group, E // n_group)  # [T, G, E/G]
    group_scores = grouped.topk(min(2, E // n_group), dim=-1).values.sum(dim=-1)  # [T, G]
    top_groups = group_scores.topk(topk_group, dim=-1).indices  # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top_groups, True)  # [T, G]
    keep = keep[:, :, None].expand(T, n_group, E // n_group).reshape(T, E)  # [T, E]
    return choice.masked_fill(~keep, float("-inf"))
