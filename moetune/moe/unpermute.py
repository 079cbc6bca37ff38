"""Phase `unpermute`: put expert outputs back in token order, weight-sum over K, add the shared expert."""

from __future__ import annotations

import torch


def unpermute(
    y_sorted: torch.Tensor,
    sorted_copy_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """y_sorted: [T*K, D] in expert order; sorted_copy_ids: [T*K]; topk_weights: [T, K] → [T, D]."""
    T, K = topk_weights.shape
    y = torch.empty_like(y_sorted)  # [T*K, D]
    y[sorted_copy_ids] = y_sorted
    out = (y.view(T, K, -1) * topk_weights.to(y.dtype)[:, :, None]).sum(dim=1)  # [T, D]
    return out if shared is None else out + shared
