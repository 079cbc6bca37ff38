"""fused_experts: the expert phase as two grouped-GEMM launches over an AlignedLayout.

  x [T, D] ──gate_up (gather rows, SiLU·mul epilogue)──► h [max_padded, I] ──down (scatter)──► out [T*K, D]

Activations bf16/fp16/fp32 with fp32 accumulation; weights in any `WeightFormat`. Twin:
`reference.fused_experts_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moetune.kernels.configs import GemmConfig, default_config
from moetune.kernels.layout import AlignedLayout
from moetune.kernels.moe_gemm import down_kernel, gate_up_kernel
from moetune.kernels.quant_formats import PackedWeight

_TL_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def dot_dtype(x: torch.Tensor):
    """Tensor-core dtype on CUDA; fp32 elsewhere (the CPU interpreter's bf16 dot is wrong, and the
    CPU path computes in fp32 anyway, docs/architecture.md §6)."""
    return _TL_DTYPE[x.dtype] if x.is_cuda else tl.float32


def _check(x: torch.Tensor, w13: PackedWeight, w2: PackedWeight, layout: AlignedLayout) -> None:
    if x.dtype not in _TL_DTYPE:
        raise ValueError(f"activations must be bf16/fp16/fp32, got {x.dtype}")
    D, I = x.shape[1], w2.in_features
    if (w13.in_features, w13.out_features) != (D, 2 * I) or w2.out_features != D:
        raise ValueError(f"w13 must be [P, 2I, D] and w2 [P, D, I]; got w13 N={w13.out_features} "
                         f"Kd={w13.in_features}, w2 N={w2.out_features} Kd={I}, D={D}")
    if w13.num_experts != w2.num_experts:
        raise ValueError("w13 and w2 hold different numbers of expert slots")


def _scale_args(w: PackedWeight) -> tuple:
    """(scale tensor, stride_se, stride_sn, stride_sk) — a dummy pointer for FORMAT NONE."""
    if w.scale is None:
        return w.data, 0, 0, 0
    s = w.scale
    return s, s.stride(0), s.stride(1), s.stride(2) if s.dim() == 3 else 0


def _configs(T: int, layout: AlignedLayout, num_experts: int, up: GemmConfig | None, down: GemmConfig | None):
    base = default_config(T, num_experts, layout.top_k).with_block_m(layout.block_m)
    up, down = up or base, down or base
    if up.block_m != layout.block_m or down.block_m != layout.block_m:
        raise ValueError(f"config BLOCK_SIZE_M ({up.block_m}, {down.block_m}) != layout block_m {layout.block_m}")
    return up, down


def _launch(kernel, cfg: GemmConfig, layout: AlignedLayout, n: int, *args, **consts) -> None:
    num_pid_m = triton.cdiv(layout.sorted_token_ids.shape[0], layout.block_m)
    grid = (num_pid_m * triton.cdiv(n, cfg.block_n),)
    kernel[grid](*args, num_pid_m, *consts.pop("strides"), **consts, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                 BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def gate_up(x: torch.Tensor, w13: PackedWeight, layout: AlignedLayout, cfg: GemmConfig, h: torch.Tensor) -> None:
    """First launch: h [max_padded, I] (padded order) = SiLU(x·w13_gateᵀ) · (x·w13_upᵀ), gathered rows."""
    T, D = x.shape
    I, s = w13.out_features // 2, _scale_args(w13)
    _launch(gate_up_kernel, cfg, layout, I,
            x, h, w13.data, s[0], layout.sorted_token_ids, layout.expert_ids, layout.num_tokens_post_padded,
            I, D, T * layout.top_k, layout.top_k,
            strides=(*x.stride(), *h.stride(), *w13.data.stride(), *s[1:]),
            FORMAT=int(w13.fmt), GROUP=max(w13.group_size, 1), DOT_DTYPE=dot_dtype(x))


def down(h: torch.Tensor, w2: PackedWeight, layout: AlignedLayout, cfg: GemmConfig, out: torch.Tensor,
         topk_weights: torch.Tensor | None) -> None:
    """Second launch: out [T*K, D] (copy order) = h·w2ᵀ [· routing weight]; zeros for skipped experts."""
    D, I, s = w2.out_features, w2.in_features, _scale_args(w2)
    weights = topk_weights.float().reshape(-1).contiguous() if topk_weights is not None else out  # [T*K]
    _launch(down_kernel, cfg, layout, D,
            h, out, weights, w2.data, s[0], layout.sorted_token_ids, layout.expert_ids,
            layout.num_tokens_post_padded, D, I, out.shape[0],
            strides=(*h.stride(), *out.stride(), *w2.data.stride(), *s[1:]),
            MUL_ROUTED_WEIGHT=topk_weights is not None, FORMAT=int(w2.fmt), GROUP=max(w2.group_size, 1),
            DOT_DTYPE=dot_dtype(h))


def fused_experts(
    x: torch.Tensor, w13: PackedWeight, w2: PackedWeight, layout: AlignedLayout,
    topk_weights: torch.Tensor | None = None, config_up: GemmConfig | None = None,
    config_down: GemmConfig | None = None, out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, D] token order; w13 [P, 2I, D]; w2 [P, D, I]; topk_weights [T, K] fp32 multiplies each
    copy's output when given → out [T*K, D] in copy order (copies of skipped experts are zero).
    out / workspace ([max_padded, I], x.dtype): optional preallocated buffers (any contents)."""
    _check(x, w13, w2, layout)
    T, D = x.shape
    I, K = w2.in_features, layout.top_k
    up, dn = _configs(T, layout, w13.num_experts, config_up, config_down)
    out = torch.empty(T * K, D, dtype=x.dtype, device=x.device) if out is None else out  # [T*K, D]
    if T == 0:
        return out
    rows = layout.sorted_token_ids.shape[0]
    h = torch.empty(rows, I, dtype=x.dtype, device=x.device) if workspace is None else workspace  # [max_padded, I]
    gate_up(x, w13, layout, up, h)
    down(h, w2, layout, dn, out, topk_weights)
    return out
