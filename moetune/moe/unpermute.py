"""Phase `unpermute`: put expert outputs back in token order, weight-sum over K, add the shared expert."""

from __future__ import annotations

import torch


def unpermute(
    y_sorted: torch.Tensor,
    sorted_copy_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """y_sorted: [T*K, D] in sorted order; sorted_copy_ids: [T*K]; topk_weights: [T, K] → [T, D]."""
    T, K = topk_weights.shape
    y = copy_order(y_sorted, sorted_copy_ids)  # [T*K, D]
    out = (y.view(T, K, y.shape[-1]) * topk_weights.to(y.dtype)[:, :, None]).sum(dim=1)  # [T, D]
    return out if shared is None else out + shared


def copy_order(y_sorted: torch.Tensor, sorted_copy_ids: torch.Tensor) -> torch.Tensor:
    """Rows in sorted order → rows in copy order t * K + k (a scatter; no host sync)."""
    return torch.empty_like(y_sorted).index_copy_(0, sorted_copy_ids, y_sorted)
