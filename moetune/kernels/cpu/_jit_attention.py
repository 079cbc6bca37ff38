"""Paged decode attention: one query token per sequence, keys / values read through block tables
(numba; imported by `_jit`)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._jit_tiles import F0, F1
from moetune.kernels.cpu._opts import OPTS


@njit(inline="always", **OPTS)
def _attention_item(q, k_pool, v_pool, tables, lens, block, scale, window, p, out, t):
    """Work item t = (sequence b, kv head kh) of `decode_attention`. Inlined into both drivers,
    and the values summed in a local [G, Dh] array, not in `out`: compiled on its own, or summing
    into `out` in the serial driver, the same loops ran 3.3-3.5x slower (measured)."""
    H, Dh = q.shape[1], q.shape[2]
    Hkv = k_pool.shape[1]
    G = H // Hkv
    b, kh = t // Hkv, t % Hkv
    n = lens[b]
    first = max(0, n - window) if window > 0 else 0
    rows = _cache_rows(tables, b, first, n, block)  # [n - first] pool row of each position
    for i in range(n - first):
        for g in range(G):
            s = F0
            for d in range(Dh):
                s += q[b, kh * G + g, d] * k_pool[rows[i], kh, d]
            p[t, g, i] = s * scale
    acc = np.zeros((G, Dh), np.float32)
    for g in range(G):
        top = p[t, g, 0]
        for i in range(n - first):
            top = max(top, p[t, g, i])
        total = F0
        for i in range(n - first):
            e = np.exp(p[t, g, i] - top)
            p[t, g, i] = e
            total += e
        inv = F1 / total
        for i in range(n - first):
            p[t, g, i] *= inv
    for i in range(n - first):
        r = rows[i]
        for g in range(G):
            w = p[t, g, i]
            for d in range(Dh):
                acc[g, d] += w * v_pool[r, kh, d]
    for g in range(G):
        for d in range(Dh):
            out[b, kh * G + g, d] = acc[g, d]


@njit(parallel=True, **OPTS)
def decode_attention(q, k_pool, v_pool, tables, lens, block, scale, window, p, out):
    """q [B, H, Dh]; k_pool, v_pool [rows, Hkv, Dh]; tables [B, nb] block ids; lens [B] context
    lengths (this step's token included); p [B * Hkv, G, max window] scratch; out [B, H, Dh].
    Work items: (sequence, kv head); the G = H / Hkv query heads of the group share each key and
    value row read, and take a softmax over positions [lens - window, lens) (window 0: all)."""
    for t in prange(q.shape[0] * k_pool.shape[1]):
        _attention_item(q, k_pool, v_pool, tables, lens, block, scale, window, p, out, t)


@njit(**OPTS)
def decode_attention_serial(q, k_pool, v_pool, tables, lens, block, scale, window, p, out):
    for t in range(q.shape[0] * k_pool.shape[1]):
        _attention_item(q, k_pool, v_pool, tables, lens, block, scale, window, p, out, t)


@njit(**OPTS)
def _cache_rows(tables, b, first, n, block):
    """Pool rows of positions [first, n) of sequence b, walking its blocks: one integer division
    per block, not two per position (a runtime divisor costs tens of cycles)."""
    rows = np.empty(n - first, np.int64)
    j = first // block
    o = first - j * block
    i = 0
    while i < n - first:
        base = tables[b, j] * block
        while o < block and i < n - first:
            rows[i] = base + o
            i += 1
            o += 1
        j += 1
        o = 0
    return rows
