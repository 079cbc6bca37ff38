"""The numba halves of a fused decode layer (imported lazily by `runtime.jit_layer()`, never at
package import; called by `moetune.model.fused_decode`).

Each function strings together the kernels of `_jit` that a decoder layer calls one by one
through Python otherwise, in the same order and with the same arithmetic, so the outputs match the
unfused layer's to rounding (the same kernels, compiled into another caller).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moetune.kernels.cpu._jit import (OPTS, decode_attention_serial, linear_dense_serial, active_experts,
                                      decode_attention, experts_dense, linear_dense, linear_q8, linear_q8_serial,
                                      permute_rows, rms_norm, rope_rotate_half, select_topk, unpermute_rows)

BLOCK_N = 8  # weight rows per work item of a projection (linear.BLOCK_N)
QK_NONE, QK_PER_HEAD, QK_FULL = 0, 1, 2  # GQASpec.qk_norm


@njit(**OPTS)
def _project(x, w, ones, bias, threads, serial_bytes, q8=False):
    """x [T, K] @ w [N, K].T (+ bias [N], or an empty bias) → a new [T, N]: on `threads` threads,
    or on this one under serial_bytes of weights (`runtime.launch`'s rule); `ones` the rows' scales.
    q8: int8 rows against one x row take the integer path (`linear.linear`'s rule)."""
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    parallel = threads > 1 and w.size * w.itemsize >= serial_bytes
    if q8 and w.itemsize == 1 and x.shape[0] == 1:
        if parallel:
            linear_q8(x, w, ones, y, BLOCK_N)
        else:
            linear_q8_serial(x, w, ones, y, BLOCK_N)
    elif parallel:
        linear_dense(x, w, ones, y, BLOCK_N)
    else:
        linear_dense_serial(x, w, ones, y, BLOCK_N)
    if bias.shape[0]:
        for t in range(y.shape[0]):
            for n in range(y.shape[1]):
                y[t, n] += bias[n]
    return y


@njit(**OPTS)
def _norm_rows(x, w, eps):
    """RMSNorm of each row of x [T, C] in place (through a scratch: `rms_norm` writes another array)."""
    out = np.empty(x.shape, np.float32)
    rms_norm(x, w, eps, out)
    x[:, :] = out


@njit(**OPTS)
def _qk_norm(qkv, H, Hkv, Dh, kind, q_w, k_w, eps):
    """The q and k RMSNorms of qkv [T, (H + 2Hkv)·Dh], in place: over each head (per_head) or
    over the whole q and k projections (full)."""
    T = qkv.shape[0]
    if kind == QK_FULL:
        _norm_rows(qkv[:, : H * Dh], q_w, eps)
        _norm_rows(qkv[:, H * Dh : (H + Hkv) * Dh], k_w, eps)
    elif kind == QK_PER_HEAD:
        heads = qkv.reshape(T, H + 2 * Hkv, Dh)
        for t in range(T):
            _norm_rows(heads[t, :H], q_w, eps)
            _norm_rows(heads[t, H : H + Hkv], k_w, eps)


@njit(**OPTS)
def attention_block(h, norm1, norm2, eps, wqkv, ones_qkv, bqkv, wo, ones_o, bo, H, Hkv, Dh,
                    qk_kind, q_w, k_w, qk_eps, clip, cos, sin, rows, k_pool, v_pool, tables, lens, block, scale,
                    window, scores, kv_read, wg, ones_g, bias, use_bias, sigmoid, top_k, renormalize, scaling,
                    threads, serial_bytes, x_out, topk_w, topk_ids, q8):
    """The attention half of a decode layer and the router of its MoE block, for T one-token
    sequences:

      x = norm1(h) → qkv = x·Wqkv (+b) → [full q/k norm] → [clip] → [per-head q/k norm]
        → rotate q, k (cos, sin [T, Dh]) → k, v into the pools at `rows` [T]
        → paged attention (tables, lens, scores: the step's `DecodePlan`) → h += attn·Wo (+b)
      x_out = norm2(h) → logits = x_out·Wg → topk_w, topk_ids [T, K]

    h [T, D] is updated in place; clip ≤ 0 means none; q8: int8 projections at T = 1 in integers."""
    T = h.shape[0]
    x = np.empty(h.shape, np.float32)
    rms_norm(h, norm1, eps, x)
    qkv = _project(x, wqkv, ones_qkv, bqkv, threads, serial_bytes, q8)  # [T, (H + 2Hkv)·Dh]
    if qk_kind == QK_FULL:
        _qk_norm(qkv, H, Hkv, Dh, qk_kind, q_w, k_w, qk_eps)
    if clip > 0:
        for t in range(T):
            for c in range(qkv.shape[1]):
                qkv[t, c] = min(max(qkv[t, c], -clip), clip)
    if qk_kind == QK_PER_HEAD:
        _qk_norm(qkv, H, Hkv, Dh, qk_kind, q_w, k_w, qk_eps)
    heads = qkv.reshape(T, H + 2 * Hkv, Dh)
    rope_rotate_half(heads[:, : H + Hkv], cos, sin)
    for t in range(T):
        k_pool[rows[t]] = heads[t, H : H + Hkv]
        v_pool[rows[t]] = heads[t, H + Hkv :]
    q = np.ascontiguousarray(heads[:, :H])  # [T, H, Dh]
    out = np.empty((T, H, Dh), np.float32)
    if threads > 1 and kv_read >= serial_bytes:
        decode_attention(q, k_pool, v_pool, tables, lens, block, scale, window, scores, out)
    else:
        decode_attention_serial(q, k_pool, v_pool, tables, lens, block, scale, window, scores, out)
    y = _project(out.reshape(T, H * Dh), wo, ones_o, bo, threads, serial_bytes, q8)  # [T, D]
    for t in range(T):
        for d in range(h.shape[1]):
            h[t, d] += y[t, d]
    rms_norm(h, norm2, eps, x_out)
    logits = _project(x_out, wg, ones_g, bo[:0], threads, serial_bytes)  # [T, E]
    select_topk(logits, bias, use_bias, sigmoid, top_k, renormalize, scaling, topk_w, topk_ids,
                np.empty(logits.shape, np.float32))


@njit(**OPTS)
def moe_block(h, x, slots, topk_w, num_slots, w13, s13, w2, s2, weight_bytes, row_limit, shared, use_shared,
              threads, serial_bytes, block13, block2, schedule, q8):
    """The experts half of a decode layer: permute x [T, D] by `slots` [T, K] (physical), every
    active expert's w13 → SiLU·mul → w2 over its rows, unpermute with topk_w [T, K] (+ shared
    [T, D] when use_shared), and h [T, D] += that. weight_bytes: of all num_slots experts, as
    `experts.fused_experts_cpu` counts them for `launch`'s rule. Returns 0, or without touching h: 1
    when a slot is out of range, 2 when a slot has more than row_limit rows (torch's GEMM is faster
    there: the caller runs the unfused phases). q8: one-row int8 experts in integers (`experts_dense`)."""
    T, K = slots.shape
    D, I = x.shape[1], w2.shape[2]
    counts = np.empty(num_slots, np.int64)
    offsets = np.empty(num_slots + 1, np.int64)
    copy_ids = np.empty(T * K, np.int64)
    x_sorted = np.empty((T * K, D), np.float32)
    if not permute_rows(x, slots, counts, offsets, copy_ids, x_sorted):
        return 1
    if counts.max() > row_limit:
        return 2
    active = active_experts(offsets, T * K)
    y = np.zeros((T * K, D), np.float32)
    lanes = threads if threads > 1 and weight_bytes * active.shape[0] // num_slots >= serial_bytes else 1
    experts_dense(x_sorted, offsets, active, w13, s13, w2, s2, np.empty((T * K, I), np.float32), y,
                  block13, block2, schedule, lanes, q8)
    out = shared.copy() if use_shared else np.zeros((T, D), np.float32)
    unpermute_rows(y, copy_ids, topk_w, out)
    for t in range(T):
        for d in range(D):
            h[t, d] += out[t, d]
    return 0
