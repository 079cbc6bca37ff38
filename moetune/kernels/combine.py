"""combine: each token's K expert outputs → one row, weighted, in token order (gather form).

out[t, d] = Σ_k w[t, k] · y[t, k, d], fp32 accumulation. Twin: `reference.combine_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _combine_kernel(
    # y [T, K, D] in (copy order), weights [T, K] fp32 (if HAS_WEIGHTS), out [T, D]
    y_ptr, w_ptr, out_ptr,
    # sizes and strides
    D, stride_yt, stride_yk, stride_yd, stride_wt, stride_wk, stride_ot, stride_od,
    # shape constants and tile
    TOP_K: tl.constexpr, HAS_WEIGHTS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BD]
    ok = offs_d < D
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for k in tl.static_range(TOP_K):
        y = tl.load(y_ptr + t * stride_yt + k * stride_yk + offs_d * stride_yd, mask=ok, other=0.0).to(tl.float32)
        if HAS_WEIGHTS:
            y = y * tl.load(w_ptr + t * stride_wt + k * stride_wk)
        acc += y
    tl.store(out_ptr + t * stride_ot + offs_d * stride_od, acc.to(out_ptr.dtype.element_ty), mask=ok)


def combine(y: torch.Tensor, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """y [T, K, D] (expert output per token copy) → [T, D] in y.dtype; topk_weights [T, K] or None
    (None when the GEMM already applied them)."""
    T, K, D = y.shape
    if topk_weights is not None and tuple(topk_weights.shape) != (T, K):
        raise ValueError(f"topk_weights {tuple(topk_weights.shape)} does not match y [T={T}, K={K}]")
    out = torch.empty(T, D, dtype=y.dtype, device=y.device)  # [T, D]
    if T == 0:
        return out
    w = topk_weights.float() if topk_weights is not None else y  # [T, K]
    block_d = min(1024, triton.next_power_of_2(D))
    _combine_kernel[(T, triton.cdiv(D, block_d))](
        y, w, out, D, *y.stride(), w.stride(0), w.stride(1), *out.stride(),
        TOP_K=K, HAS_WEIGHTS=topk_weights is not None, BLOCK_D=block_d)
    return out
