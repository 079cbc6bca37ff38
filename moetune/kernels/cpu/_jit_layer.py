"""The numba halves of a fused decode layer (imported lazily by `runtime.jit_layer()`, never at
package import; called by `moetune.model.fused_decode`).

Each function strings together the kernels of `_jit` that a decoder layer calls one by one
through Python otherwise, in the same order and with the same arithmetic, so the outputs match the
unfused layer's to rounding (the same kernels, compiled into another caller). Their arguments are
the records of `records.py`, one per module (norms, attention, router, experts) and per step
(rows, cache pools, plan, tuning), plus the step's own arrays. The records arrive as plain tuples
(`records.plain`: numba types a named-tuple argument ~0.4 µs slower per call than a plain one, and
a layer passes 16), so each function unpacks a record in its fields' order, under their names.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moetune.kernels.cpu._jit_attention import decode_attention, decode_attention_serial
from moetune.kernels.cpu._jit_dispatch import experts_into, matmul_into
from moetune.kernels.cpu._jit_experts import active_experts
from moetune.kernels.cpu._jit_rows import permute_rows, rms_norm, rope_rotate_half, select_topk, unpermute_rows
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu.records import QK_FULL, QK_PER_HEAD

@njit(**OPTS)
def _project(x, p, tuning):
    """x [T, K] @ w [N, K].T · scale (+ bias [N], when not empty) → a new [T, N], p a `Projection`:
    on the Tuning's threads, or on this one under serial_bytes of weights (`runtime.launch`'s rule);
    int8 rows against up to the Tuning's q8 x rows, int4 against up to q4, take the integer paths
    (`linear.linear`'s rules; `_jit_dispatch.matmul_into`)."""
    w, scale, bias = p  # Projection
    threads, serial_bytes, q8, q4, q4x = tuning[0], tuning[1], tuning[5], tuning[6], (tuning[7], tuning[8])  # Tuning
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    parallel = threads > 1 and w.size * w.itemsize >= serial_bytes
    matmul_into(x, w, scale, y, parallel, q8, q4, q4x)
    if bias.shape[0]:
        for t in range(y.shape[0]):
            for n in range(y.shape[1]):
                y[t, n] += bias[n]
    return y


@njit(**OPTS)
def _norm_rows(x, norm):
    """RMSNorm (a `Norm`) of each row of x [T, C] in place (through a scratch: `rms_norm` writes another array)."""
    w, eps = norm  # Norm
    out = np.empty(x.shape, np.float32)
    rms_norm(x, w, eps, out)
    for t in range(x.shape[0]):  # not `x[:, :] = out`: numba's array assignment compiles its shape-mismatch
        for c in range(x.shape[1]):  # message (string formatting), ~3 s of a cold start (docs/cpu.md)
            x[t, c] = out[t, c]


@njit(**OPTS)
def _qk_norm(qkv, a):
    """The q and k RMSNorms of qkv [T, (H + 2Hkv)·Dh] (a an `Attention`), in place: over each head
    (per_head) or over the whole q and k projections (full)."""
    _, _, H, Hkv, Dh, qk_kind, q_norm, k_norm, _, _ = a  # Attention
    T = qkv.shape[0]
    if qk_kind == QK_FULL:
        _norm_rows(qkv[:, : H * Dh], q_norm)
        _norm_rows(qkv[:, H * Dh : (H + Hkv) * Dh], k_norm)
    elif qk_kind == QK_PER_HEAD:
        heads = qkv.reshape(T, H + 2 * Hkv, Dh)
        for t in range(T):
            _norm_rows(heads[t, :H], q_norm)
            _norm_rows(heads[t, H : H + Hkv], k_norm)


@njit(**OPTS)
def _attend(x, a, step, pools, plan, tuning):
    """The attention of x [T, D] (the normed h) → [T, D]: qkv = x·Wqkv (+b) → [full q/k norm] → [clip]
    → [per-head q/k norm] → rotate q, k (cos, sin [T, Dh]) → k, v into the pools at the step's
    rows [T] → paged attention (the step's `DecodePlan`) → ·Wo (+b)."""
    wqkv, wo, H, Hkv, Dh, qk_kind, _, _, clip, scale = a  # Attention
    cos, sin, rows = step  # StepRows
    k_pool, v_pool = pools  # KVPools
    tables, lens, block_size, window, scores, read = plan  # DecodePlan
    T = x.shape[0]
    qkv = _project(x, wqkv, tuning)  # [T, (H + 2Hkv)·Dh]
    if qk_kind == QK_FULL:
        _qk_norm(qkv, a)
    if clip > 0:
        for t in range(T):
            for c in range(qkv.shape[1]):
                qkv[t, c] = min(max(qkv[t, c], -clip), clip)
    if qk_kind == QK_PER_HEAD:
        _qk_norm(qkv, a)
    heads = qkv.reshape(T, H + 2 * Hkv, Dh)
    rope_rotate_half(heads[:, : H + Hkv], cos, sin)
    for t in range(T):
        k_pool[rows[t]] = heads[t, H : H + Hkv]
        v_pool[rows[t]] = heads[t, H + Hkv :]
    q = np.ascontiguousarray(heads[:, :H])  # [T, H, Dh]
    out = np.empty((T, H, Dh), np.float32)
    if tuning[0] > 1 and read >= tuning[1]:  # Tuning: threads, serial_bytes
        decode_attention(q, k_pool, v_pool, tables, lens, block_size, scale, window, scores, out)
    else:
        decode_attention_serial(q, k_pool, v_pool, tables, lens, block_size, scale, window, scores, out)
    return _project(out.reshape(T, H * Dh), wo, tuning)  # [T, D]


@njit(**OPTS)
def attention_block(h, attn_norm, attn, step, pools, plan, mlp_norm, router, tuning, x_out, topk_w, topk_ids):
    """The attention half of a decode layer and the router of its MoE block, for T rows (the
    records of `records.py`): one-token sequences, or a verify step's rows, each its own query
    over its sequence's cache up to its position (the plan's tables and lengths are per row; every
    row's K and V are written before any row attends, so a sequence's rows see each other causally):

      h += attention(attn_norm(h))        (`_attend`: attn, step, pools, plan)
      x_out = mlp_norm(h) → logits = x_out·Wg → topk_w, topk_ids [T, K]   (router)

    h [T, D] is updated in place."""
    gate, bias, use_bias, sigmoid, top_k, renormalize, scaling = router  # Router
    x = np.empty(h.shape, np.float32)
    rms_norm(h, attn_norm[0], attn_norm[1], x)  # Norm: w, eps
    y = _attend(x, attn, step, pools, plan, tuning)  # [T, D]
    for t in range(h.shape[0]):
        for d in range(h.shape[1]):
            h[t, d] += y[t, d]
    rms_norm(h, mlp_norm[0], mlp_norm[1], x_out)
    logits = _project(x_out, gate, tuning)  # [T, E]
    select_topk(logits, bias, use_bias, sigmoid, top_k, renormalize, scaling, topk_w, topk_ids,
                np.empty(logits.shape, np.float32))


@njit(**OPTS)
def moe_block(h, x, slots, topk_w, experts, shared, use_shared, tuning):
    """The experts half of a decode layer: permute x [T, D] by `slots` [T, K] (physical), every
    active expert's w13 → SiLU·mul → w2 over its rows (an `Experts` record, fp32 / int8 / int4:
    one-row int8 experts in integers when the Tuning's q8 is on, int4 ones of ≤ q4 rows;
    `_jit_dispatch.experts_into`), unpermute with topk_w [T, K] (+ shared [T, D] when use_shared),
    and h [T, D] += that. Returns 0, or without touching
    h: 1 when a slot is out of range, 2 when a slot has more than row_limit rows (torch's GEMM is
    faster there: the caller runs the unfused phases)."""
    nbytes, P, row_limit = experts[4], experts[5], experts[6]  # Experts
    threads, serial_bytes = tuning[0], tuning[1]  # Tuning
    T, K = slots.shape
    D = x.shape[1]
    counts = np.empty(P, np.int64)
    offsets = np.empty(P + 1, np.int64)
    copy_ids = np.empty(T * K, np.int64)
    x_sorted = np.empty((T * K, D), np.float32)
    if not permute_rows(x, slots, counts, offsets, copy_ids, x_sorted):
        return 1
    if counts.max() > row_limit:
        return 2
    active = active_experts(offsets, T * K)
    y = np.zeros((T * K, D), np.float32)
    lanes = threads if threads > 1 and nbytes * active.shape[0] // P >= serial_bytes else 1
    experts_into(x_sorted, offsets, active, experts, tuning, lanes, y)
    out = shared.copy() if use_shared else np.zeros((T, D), np.float32)
    unpermute_rows(y, copy_ids, topk_w, out)
    for t in range(T):
        for d in range(D):
            h[t, d] += out[t, d]
    return 0
