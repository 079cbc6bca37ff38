"""The row-wise ops of a step (numba, one thread; imported by `_jit`): RMSNorm, rotary, and an MoE
layer's routing bookkeeping (top-k selection, permute, unpermute)."""

from __future__ import annotations

import numpy as np
from numba import njit

from moetune.kernels.cpu._jit_tiles import F0, F1
from moetune.kernels.cpu._opts import OPTS

# --- row-wise ops of a step: RMSNorm and rotary embedding (one thread; a few rows in decode) -------

@njit(**OPTS)
def rms_norm(x, w, eps, out):
    """x [T, D] fp32 (any strides), w [D] → out [T, D] = w · x / sqrt(mean(x²) + eps)."""
    T, D = x.shape
    for t in range(T):
        ss = F0
        for d in range(D):
            ss += x[t, d] * x[t, d]
        inv = F1 / np.sqrt(ss / np.float32(D) + eps)
        for d in range(D):
            out[t, d] = w[d] * (x[t, d] * inv)


@njit(**OPTS)
def rope_rotate_half(x, cos, sin):
    """In place on x [T, H, R] (any strides): x·cos + rotate_half(x)·sin with cos, sin [T, R];
    rotate_half(x) = (-x[R/2:], x[:R/2])."""
    T, H, R = x.shape
    half = R // 2
    for t in range(T):
        for h in range(H):
            for i in range(half):
                a, b = x[t, h, i], x[t, h, half + i]
                x[t, h, i] = a * cos[t, i] - b * sin[t, i]
                x[t, h, half + i] = b * cos[t, half + i] + a * sin[t, half + i]


# --- routing bookkeeping of an MoE layer: top-k selection, permute, unpermute (one thread) ----------

@njit(inline="always", **OPTS)
def _insert_topk(scores, bias, use_bias, t, ids, best):
    """ids[t] ← the K experts of highest scores[t] (+ bias), best first, the lower id on ties: one
    pass over E keeping a sorted list of the best so far (a later id enters only when strictly
    better), O(E) when few enter, against K passes over E with an O(K) "taken" check each."""
    E, K = scores.shape[1], ids.shape[1]
    n = 0
    for e in range(E):
        val = scores[t, e] + (bias[e] if use_bias else F0)
        if n == K and not val > best[K - 1]:
            continue
        j = min(n, K - 1)
        while j > 0 and val > best[j - 1]:
            best[j] = best[j - 1]
            ids[t, j] = ids[t, j - 1]
            j -= 1
        best[j] = val
        ids[t, j] = e
        n = min(n + 1, K)


@njit(**OPTS)
def select_topk(logits, bias, use_bias, sigmoid, top_k, renormalize, scaling, weights, ids, scores):
    """logits [T, E] → scores [T, E] (softmax or sigmoid); ids [T, K] of the K highest
    scores (+ bias when use_bias), best first, the lower id on ties; weights [T, K] their unbiased
    scores, renormalised to sum 1 when asked, times `scaling`."""
    T, E = logits.shape
    best = np.empty(top_k, np.float32)  # the selection values of ids[t, :k], scratch
    for t in range(T):
        if sigmoid:
            for e in range(E):
                scores[t, e] = F1 / (F1 + np.exp(-logits[t, e]))
        else:
            top = logits[t, 0]
            for e in range(E):
                top = max(top, logits[t, e])
            total = F0
            for e in range(E):
                scores[t, e] = np.exp(logits[t, e] - top)
                total += scores[t, e]
            for e in range(E):
                scores[t, e] /= total
        _insert_topk(scores, bias, use_bias, t, ids, best)
        total = F0
        for k in range(top_k):
            weights[t, k] = scores[t, ids[t, k]]
            total += weights[t, k]
        for k in range(top_k):
            w = weights[t, k]
            if renormalize:
                w = w / (total + (np.float32(1e-20) if sigmoid else F0))
            weights[t, k] = w * scaling


@njit(**OPTS)
def permute_rows(x, slot_ids, counts, offsets, sorted_copy_ids, x_sorted):
    """slot_ids [T, K] → counts [P] copies per slot, offsets [P+1], sorted_copy_ids [T*K] (copies
    grouped by slot, in copy order within one: a stable counting sort) and x_sorted [T*K, D].
    Returns False (and fills nothing else) when a slot id is outside [0, P)."""
    T, K = slot_ids.shape
    P = counts.shape[0]
    counts[:] = 0
    for t in range(T):
        for k in range(K):
            p = slot_ids[t, k]
            if p < 0 or p >= P:
                return False
            counts[p] += 1
    offsets[0] = 0
    for p in range(P):
        offsets[p + 1] = offsets[p] + counts[p]
    fill = offsets[:-1].copy()
    for t in range(T):
        for k in range(K):
            i = fill[slot_ids[t, k]]
            fill[slot_ids[t, k]] = i + 1
            sorted_copy_ids[i] = t * K + k
            for d in range(x.shape[1]):
                x_sorted[i, d] = x[t, d]
    return True


@njit(**OPTS)
def unpermute_rows(y_sorted, sorted_copy_ids, topk_weights, out):
    """out [T, D] += Σ_k topk_weights[t, k] · y_sorted[row of copy t*K + k]; out holds the shared
    expert's output (or zeros) on entry."""
    T, K = topk_weights.shape
    row_of = np.empty(T * K, np.int64)
    for i in range(sorted_copy_ids.shape[0]):
        row_of[sorted_copy_ids[i]] = i
    D = out.shape[1]
    acc = np.empty(D, np.float32)  # [D]: row by row over k, so the inner loop runs along D (SIMD)
    for t in range(T):
        acc[:] = F0
        for k in range(K):
            w, r = topk_weights[t, k], row_of[t * K + k]
            for d in range(D):
                acc[d] += w * y_sorted[r, d]
        for d in range(D):
            out[t, d] += acc[d]
