"""The two grouped-GEMM kernels of the expert phase, over the blocks of an AlignedLayout.

  gate_up: h[row] = SiLU(x[tok] @ w13[e, :I]ᵀ) · (x[tok] @ w13[e, I:]ᵀ)   rows gathered, h in padded order
  down:    out[copy] = (h[row] @ w2[e]ᵀ) [· routing weight]               rows scattered to copy order
where row indexes the padded layout, copy = sorted_token_ids[row], tok = copy // K, e = the block's
expert. Weight formats are a `FORMAT: tl.constexpr` (WeightFormat values): tiles are dequantised
before the dot, per-channel scales (INT8, FP8) are applied once to the fp32 accumulator.
Program ids are swizzled in groups of GROUP_M row-blocks (as in triton tutorial 03).
"""

from __future__ import annotations

import triton
import triton.language as tl

_NONE = tl.constexpr(0)
_INT8 = tl.constexpr(1)
_INT4 = tl.constexpr(2)
_FP8 = tl.constexpr(3)


@triton.jit
def _tile_ids(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Program id → (row block, column block), GROUP_M row blocks sharing each weight column panel."""
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def _weight_tile(w_ptr, scale_ptr, expert, offs_k, offs_n, N, KD,
                 stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                 FORMAT: tl.constexpr, GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """The [BLOCK_K, BLOCK_N] tile of w[expert]ᵀ in DOT_DTYPE (per-channel scales not applied)."""
    ok = (offs_k[:, None] < KD) & (offs_n[None, :] < N)
    rows = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn  # [1, BN]
    if FORMAT == _INT4:
        packed = tl.load(rows + (offs_k[:, None] // 2) * stride_wk, mask=ok, other=0).to(tl.int32)
        q = ((packed >> ((offs_k[:, None] % 2) * 4)) & 0xF) - 8  # [BK, BN]
        s = tl.load(scale_ptr + expert * stride_se + offs_n[None, :] * stride_sn + (offs_k[:, None] // GROUP) * stride_sk,
                    mask=ok, other=0.0)
        return (q.to(tl.float32) * s).to(DOT_DTYPE)
    w = tl.load(rows + offs_k[:, None] * stride_wk, mask=ok)  # no `other`: fp8 has no literal zero here
    return tl.where(ok, w.to(DOT_DTYPE), 0.0).to(DOT_DTYPE)


@triton.jit
def _channel_scale(acc, scale_ptr, expert, offs_n, N, stride_se, stride_sn, FORMAT: tl.constexpr):
    if FORMAT == _INT8 or FORMAT == _FP8:
        s = tl.load(scale_ptr + expert * stride_se + offs_n * stride_sn, mask=offs_n < N, other=0.0)  # [BN]
        acc = acc * s[None, :]
    return acc


@triton.jit
def _mma(a, b, acc, DOT_DTYPE: tl.constexpr):
    """acc += a @ b with fp32 accumulation; fp32 operands stay fp32 (no tf32)."""
    if DOT_DTYPE == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def gate_up_kernel(
    # activations: x [T, D] in, h [max_padded, I] out
    x_ptr, h_ptr,
    # weights w13 [P, 2I, Kd] (Kd = D, or D/2 bytes for INT4) and scales [P, 2I] or [P, 2I, D/GROUP]
    w_ptr, scale_ptr,
    # aligned layout
    sorted_ids_ptr, expert_ids_ptr, post_padded_ptr,
    # sizes: I, D, copies = T*K (the padding sentinel), K, row blocks in the grid
    I, D, num_copies, top_k, num_pid_m,
    # strides
    stride_xt, stride_xd, stride_hm, stride_hi,
    stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    # weight format and dot dtype
    FORMAT: tl.constexpr, GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr,
    # tiles
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_pid_m, tl.cdiv(I, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_padded_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)  # int64: expert * stride_we passes 2**31
    if expert < 0:
        return  # not on this rank: the down kernel writes zeros for these copies
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] padded rows
    copies = tl.load(sorted_ids_ptr + offs_m)  # [BM]
    row_ok = copies < num_copies
    tokens = tl.where(row_ok, copies // top_k, 0)  # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] columns of gate (and of up, + I)
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, D, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + offs_k[None, :] * stride_xd,
                    mask=row_ok[:, None] & (offs_k[None, :] < D), other=0.0).to(DOT_DTYPE)  # [BM, BK]
        b_gate = _weight_tile(w_ptr, scale_ptr, expert, offs_k, offs_n, I, D, stride_we, stride_wn, stride_wk,
                              stride_se, stride_sn, stride_sk, FORMAT, GROUP, DOT_DTYPE)
        b_up = _weight_tile(w_ptr, scale_ptr, expert, offs_k, offs_n + I, 2 * I, D, stride_we, stride_wn, stride_wk,
                            stride_se, stride_sn, stride_sk, FORMAT, GROUP, DOT_DTYPE)
        acc_gate = _mma(a, b_gate, acc_gate, DOT_DTYPE)
        acc_up = _mma(a, b_up, acc_up, DOT_DTYPE)
    gate = _channel_scale(acc_gate, scale_ptr, expert, offs_n, I, stride_se, stride_sn, FORMAT)
    up = _channel_scale(acc_up, scale_ptr, expert, offs_n + I, 2 * I, stride_se, stride_sn, FORMAT)
    h = gate / (1.0 + tl.exp(-gate)) * up  # [BM, BN] SiLU(gate) · up
    tl.store(h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :] * stride_hi, h.to(h_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_n[None, :] < I))


@triton.jit
def down_kernel(
    # activations: h [max_padded, I] in, out [T*K, D] out (copy order); routing weights [T*K] fp32
    h_ptr, out_ptr, topk_weights_ptr,
    # weights w2 [P, D, Kd] (Kd = I, or I/2 bytes for INT4) and scales [P, D] or [P, D, I/GROUP]
    w_ptr, scale_ptr,
    # aligned layout
    sorted_ids_ptr, expert_ids_ptr, post_padded_ptr,
    # sizes: D, I, copies = T*K, row blocks in the grid
    D, I, num_copies, num_pid_m,
    # strides
    stride_hm, stride_hi, stride_om, stride_od,
    stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    # epilogue, weight format and dot dtype
    MUL_ROUTED_WEIGHT: tl.constexpr, FORMAT: tl.constexpr, GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr,
    # tiles
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_pid_m, tl.cdiv(D, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_padded_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] padded rows
    copies = tl.load(sorted_ids_ptr + offs_m)  # [BM]
    row_ok = copies < num_copies
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] output columns
    out_ptrs = out_ptr + copies[:, None] * stride_om + offs_n[None, :] * stride_od
    out_ok = row_ok[:, None] & (offs_n[None, :] < D)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)  # int64: expert * stride_we passes 2**31
    if expert < 0:
        tl.store(out_ptrs, tl.zeros((BLOCK_M, BLOCK_N), out_ptr.dtype.element_ty), mask=out_ok)
        return
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        a = tl.load(h_ptr + offs_m[:, None] * stride_hm + offs_k[None, :] * stride_hi,
                    mask=row_ok[:, None] & (offs_k[None, :] < I), other=0.0).to(DOT_DTYPE)  # [BM, BK]
        b = _weight_tile(w_ptr, scale_ptr, expert, offs_k, offs_n, D, I, stride_we, stride_wn, stride_wk,
                         stride_se, stride_sn, stride_sk, FORMAT, GROUP, DOT_DTYPE)
        acc = _mma(a, b, acc, DOT_DTYPE)
    acc = _channel_scale(acc, scale_ptr, expert, offs_n, D, stride_se, stride_sn, FORMAT)
    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(topk_weights_ptr + copies, mask=row_ok, other=0.0)[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_ok)
