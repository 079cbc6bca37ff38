"""Paged decode attention: one query token per sequence, keys / values read through block tables
(numba; imported by `_jit`).

One work item = (sequence b, kv head kh): the G = H / Hkv query heads of the group share each K and
V row read. Positions are walked block by block of the table (one pool row per position, no row
list), the scores of a row's G heads taken together; q is scaled once (not each score); the
softmax's exp runs over a whole row of scores in a loop LLVM vectorises (`_exp_shifted`: Cephes'
expf polynomial, within ~2 ulp of libm's, where np.exp is one libm call per score), and the values
are summed unnormalised, divided by the exp sum once per head at the end.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._jit_tiles import F0, F1
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._simd_attention import LANES, axpy16, dots16

LOG2E = np.float32(1.44269504088896341)
LN2_HI, LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 = hi + lo, hi exact in 9 bits
EXP_MIN = np.float32(-87.0)  # below: exp < 2⁻¹²⁵, clamped there (≤ 1.7e-38 per score, against a sum ≥ 1)
C0, C1, C2, C3, C4, C5 = (np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                                   4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
HALF = np.float32(0.5)


@njit(inline="always", **OPTS)
def _exp_shifted(s, top, m, bits):
    """s[:m] = exp(s[:m] - top) in place (s ≤ top), returning their sum; bits int32 [≥ m] scratch.
    exp(x) = 2ᵏ·e^r, k = round(x·log2 e), r = x - k·ln 2 (|r| ≤ ln 2 / 2), e^r by Cephes' degree-7
    polynomial; 2ᵏ built in bits (k + 127 in the exponent field) and multiplied in a second loop."""
    pow2 = bits.view(np.float32)
    for i in range(m):
        x = max(s[i] - top, EXP_MIN)
        k = np.floor(x * LOG2E + HALF)
        r = x - k * LN2_HI - k * LN2_LO
        p = ((((C0 * r + C1) * r + C2) * r + C3) * r + C4) * r + C5
        s[i] = p * r * r + r + F1
        bits[i] = (np.int32(k) + np.int32(127)) << np.int32(23)
    total = F0
    for i in range(m):
        e = s[i] * pow2[i]
        s[i] = e
        total += e
    return total


@njit(inline="always", **OPTS)
def _scores(qs, k_pool, tables, b, kh, first, m, block, p, t):
    """p[t, g, i] = qs[g]·K[position first + i] for i < m, g < G (qs [G, Dh], scaled), walking the
    sequence's blocks."""
    G, Dh = qs.shape
    j = first // block
    o = first - j * block
    i = 0
    while i < m:
        base = tables[b, j] * block + o
        c = min(block - o, m - i)
        for u in range(c):
            r = base + u
            for g in range(G):
                s = F0
                for d in range(Dh):
                    s += qs[g, d] * k_pool[r, kh, d]
                p[t, g, i + u] = s
        i += c
        j += 1
        o = 0


@njit(inline="always", **OPTS)
def _values(p, v_pool, tables, b, kh, first, m, block, t, acc):
    """acc[g] += Σ_i p[t, g, i]·V[position first + i] (acc [G, Dh]), walking the sequence's blocks."""
    G, Dh = acc.shape
    j = first // block
    o = first - j * block
    i = 0
    while i < m:
        base = tables[b, j] * block + o
        c = min(block - o, m - i)
        for u in range(c):
            r = base + u
            for g in range(G):
                w = p[t, g, i + u]
                for d in range(Dh):
                    acc[g, d] += w * v_pool[r, kh, d]
        i += c
        j += 1
        o = 0


@njit(inline="always", **OPTS)
def _row_offsets(tables, b, first, m, block, stride, offs):
    """offs[i] = pool row of position first + i of sequence b, times stride (the elements of a row),
    for i < m, walking its blocks (one division per call, not two per position); offs[m:] (up to a
    whole tile) repeat offs[0], so a tile past the end reads a valid row."""
    j = first // block
    o = first - j * block
    i = 0
    while i < m:
        c = min(block - o, m - i)
        base = (tables[b, j] * block + o) * stride
        for u in range(c):
            offs[i + u] = base + u * stride
        i += c
        j += 1
        o = 0
    for i in range(m, offs.shape[0]):
        offs[i] = offs[0]


@njit(inline="always", **OPTS)
def _tile_scores(qs, k_pool, kh, m, offs, p, t, s16):
    """`_scores` by 16-position tiles (`dots16`; Dh a multiple of 16): offs [⌈m/16⌉·16] the
    positions' row offsets (`_row_offsets`)."""
    G, Dh = qs.shape
    for i0 in range(0, m, LANES):
        c = min(LANES, m - i0)
        tile = offs[i0 : i0 + LANES]
        for g in range(G):
            dots16(qs, g * Dh, k_pool, tile, kh * Dh, Dh, s16)
            for u in range(c):
                p[t, g, i0 + u] = s16[u]


@njit(inline="always", **OPTS)
def _tile_values(p, v_pool, kh, m, offs, t, acc, w16):
    """`_values` by 16-position tiles (`axpy16`; Dh a multiple of 16)."""
    G, Dh = acc.shape
    for i0 in range(0, m, LANES):
        c = min(LANES, m - i0)
        tile = offs[i0 : i0 + LANES]
        for g in range(G):
            for u in range(c):
                w16[u] = p[t, g, i0 + u]
            for u in range(c, LANES):
                w16[u] = F0
            axpy16(w16, v_pool, tile, kh * Dh, Dh, acc, g * Dh)


@njit(inline="always", **OPTS)
def _softmax_rows(p, t, G, m, bits, inv):
    """p[t, g, :m] = exp(p[t, g, :m] - their max) for g < G; inv[g] = 1 / their sum."""
    for g in range(G):
        row = p[t, g]
        top = row[0]
        for i in range(m):
            top = max(top, row[i])
        inv[g] = F1 / _exp_shifted(row, top, m, bits)


@njit(inline="always", **OPTS)
def _attention_item(q, k_pool, v_pool, tables, lens, block, scale, window, p, out, t):
    """Work item t = (sequence b, kv head kh) of `decode_attention`. Inlined into both drivers,
    and the values summed in a local [G, Dh] array, not in `out`: compiled on its own, or summing
    into `out` in the serial driver, the same loops ran 3.3-3.5x slower (measured). Its scratch
    is two allocations (each costs ~0.1 µs: six of them took a fifth of the item's time)."""
    H, Dh = q.shape[1], q.shape[2]
    Hkv = k_pool.shape[1]
    G = H // Hkv
    b, kh = t // Hkv, t % Hkv
    n = lens[b]
    first = max(0, n - window) if window > 0 else 0
    m = n - first
    tiles = Dh % LANES == 0
    GD = G * Dh
    f = np.empty(2 * GD + LANES + G + m, np.float32)  # qs, acc, s16, inv, bits
    qs, acc = f[:GD].reshape(G, Dh), f[GD : 2 * GD].reshape(G, Dh)  # [G, Dh] each
    s16, inv = f[2 * GD : 2 * GD + LANES], f[2 * GD + LANES : 2 * GD + LANES + G]
    bits = f[2 * GD + LANES + G :].view(np.int32)  # [m]
    for g in range(G):
        for d in range(Dh):
            qs[g, d] = q[b, kh * G + g, d] * scale
            acc[g, d] = F0
    if tiles:
        offs = np.empty(-(-m // LANES) * LANES, np.int64)  # [m rounded up to whole tiles]
        _row_offsets(tables, b, first, m, block, Hkv * Dh, offs)
        _tile_scores(qs, k_pool, kh, m, offs, p, t, s16)
        _softmax_rows(p, t, G, m, bits, inv)
        _tile_values(p, v_pool, kh, m, offs, t, acc, s16)
    else:
        _scores(qs, k_pool, tables, b, kh, first, m, block, p, t)
        _softmax_rows(p, t, G, m, bits, inv)
        _values(p, v_pool, tables, b, kh, first, m, block, t, acc)
    for g in range(G):
        for d in range(Dh):
            out[b, kh * G + g, d] = acc[g, d] * inv[g]


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
