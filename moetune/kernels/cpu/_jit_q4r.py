"""Int4 weights in the interleaved layout against int8-rounded x (numba; imported by `_jit`).

The layout and the tile are `_simd_q4r`'s (blocks of 16 weight rows, one int32 lane per row); here
x is rounded once per call (`quantize_rows`: int8 per group, Q8_0-style) and the tiles run over
every (block of 16 weight rows, x row) pair: 4 x rows a tile, then 2, then 1, so each unpacked
weight chunk serves up to 4 x rows and each broadcast x chunk 16 weight rows.

  linear_q4r(x, w, s, y)          y [M, Npad] = x [M, K] @ W.T (W: w uint8 [Npad, G, H], s [NB, G, 16])
  experts_q4r(x, offsets, active, w13, s13, w2, s2, a, y)
                                  y[rows of e] = (silu(x W1ᵀ)·(x W3ᵀ)) W2ᵀ for each active expert e:
                                  w13 [E, 2I, Gd, Hd] (gate rows, then up rows: blocks of 16 never
                                  straddle the two, I being a multiple of the group), w2 [E, D, Gi, Hi],
                                  their scales [E, 2I/16, Gd, 16] and [E, D/16, Gi, 16]; a [N, I] scratch.
Each has a serial twin (`*_serial`, the same work items on the calling thread).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._jit_experts import silu
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._simd_q4r import ROWS, q4r_tile_1, q4r_tile_2, q4r_tile_4

F32, I32 = np.float32, np.int32
QMAX = F32(127.0)  # int8 x, as llama.cpp's Q8_0 rounds its activations


@njit(**OPTS)
def quantize_row(x, m, G, xq, xd, xc, r):
    """xq[r] = row m of x [M, K] as int8 in the chunk order of `_simd_q4r` (per group of K/G columns,
    per 4 bytes of weights: 4 even then 4 odd columns), xd[r, g] = absmax(group g) / 127,
    xc[r, g] = −8·Σ of group g's int8 (the nibbles' zero point)."""
    gs = x.shape[1] // G
    for g in range(G):
        k0 = g * gs
        top = F32(0.0)
        for j in range(gs):
            top = max(top, abs(x[m, k0 + j]))
        inv = QMAX / top if top > 0 else F32(0.0)
        total = I32(0)
        for j in range(gs):  # j: position in xq's order; c chunk, p even (0) / odd (1), i byte in the chunk
            c, p, i = j // 8, (j // 4) % 2, j % 4
            q = np.int8(min(max(np.rint(x[m, k0 + 2 * (4 * c + i) + p] * inv), -QMAX), QMAX))
            xq[r, k0 + j] = q
            total += I32(q)
        xd[r, g] = top / QMAX
        xc[r, g] = I32(-8) * total


@njit(**OPTS)
def block_rows(xq, xd, xc, m0, m1, w, s, nb, out, orow, ocol):
    """out[orow + m − m0, ocol:ocol + 16] for the x rows [m0, m1) against weight block nb."""
    m = m0
    while m + 4 <= m1:
        q4r_tile_4(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
        m += 4
    if m + 2 <= m1:
        q4r_tile_2(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
        m += 2
    if m < m1:
        q4r_tile_1(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)


SERIAL_X = 16384  # x elements up to which a call rounds x on the calling thread (a parallel region
# wakes the other threads: more than rounding a few rows costs)


@njit(parallel=True, **OPTS)
def linear_q4r(x, w, s, y):
    M, K, G = x.shape[0], x.shape[1], w.shape[1]
    xq, xd, xc = np.empty((M, K), np.int8), np.empty((M, G), F32), np.empty((M, G), I32)
    if M * K <= SERIAL_X:
        for m in range(M):
            quantize_row(x, m, G, xq, xd, xc, m)
    else:
        for m in prange(M):
            quantize_row(x, m, G, xq, xd, xc, m)
    for nb in prange(w.shape[0] // ROWS):
        block_rows(xq, xd, xc, 0, M, w, s, nb, y, 0, nb * ROWS)


@njit(**OPTS)
def linear_q4r_serial(x, w, s, y):
    M, K, G = x.shape[0], x.shape[1], w.shape[1]
    xq, xd, xc = np.empty((M, K), np.int8), np.empty((M, G), F32), np.empty((M, G), I32)
    for m in range(M):
        quantize_row(x, m, G, xq, xd, xc, m)
    for nb in range(w.shape[0] // ROWS):
        block_rows(xq, xd, xc, 0, M, w, s, nb, y, 0, nb * ROWS)


UP_BLOCKS = 4  # blocks of 16 activation columns per work item of the w13 pass (one scratch each)


@njit(inline="always", **OPTS)
def _up_item(q, offsets, e, w13, s13, a, b0, b1):
    """a[rows of e, 16b:16b + 16] = silu(gate)·up of blocks b in [b0, b1) (gate block b, up block I/16 + b)."""
    xq, xd, xc = q
    nbi = w13.shape[1] // (2 * ROWS)
    gu = np.empty((4, 2 * ROWS), F32)  # [x rows of a tile, gate | up]
    for b in range(b0, b1):
        for m0 in range(offsets[e], offsets[e + 1], 4):
            m1 = min(offsets[e + 1], m0 + 4)
            block_rows(xq, xd, xc, m0, m1, w13[e], s13[e], b, gu, 0, 0)
            block_rows(xq, xd, xc, m0, m1, w13[e], s13[e], nbi + b, gu, 0, ROWS)
            for i in range(m1 - m0):
                for l in range(ROWS):
                    a[m0 + i, b * ROWS + l] = silu(gu[i, l]) * gu[i, ROWS + l]


@njit(parallel=True, **OPTS)
def experts_q4r(x, offsets, active, w13, s13, w2, s2, a, y):
    N, D, I, A = x.shape[0], x.shape[1], a.shape[1], active.shape[0]
    Gd, Gi = w13.shape[2], w2.shape[2]
    q = (np.empty((N, D), np.int8), np.empty((N, Gd), F32), np.empty((N, Gd), I32))
    qa = (np.empty((N, I), np.int8), np.empty((N, Gi), F32), np.empty((N, Gi), I32))
    if N * D <= SERIAL_X:
        for e in active:
            for m in range(offsets[e], offsets[e + 1]):
                quantize_row(x, m, Gd, q[0], q[1], q[2], m)
    else:
        for t in prange(A):
            for m in range(offsets[active[t]], offsets[active[t] + 1]):
                quantize_row(x, m, Gd, q[0], q[1], q[2], m)
    nbi, nbd = I // ROWS, D // ROWS
    nu = (nbi + UP_BLOCKS - 1) // UP_BLOCKS
    for t in prange(A * nu):
        u = t // A
        _up_item(q, offsets, active[t % A], w13, s13, a, u * UP_BLOCKS, min(nbi, (u + 1) * UP_BLOCKS))
    if N * I <= SERIAL_X:
        for e in active:
            for m in range(offsets[e], offsets[e + 1]):
                quantize_row(a, m, Gi, qa[0], qa[1], qa[2], m)
    else:
        for t in prange(A):
            for m in range(offsets[active[t]], offsets[active[t] + 1]):
                quantize_row(a, m, Gi, qa[0], qa[1], qa[2], m)
    for t in prange(A * nbd):
        e = active[t % A]
        block_rows(qa[0], qa[1], qa[2], offsets[e], offsets[e + 1], w2[e], s2[e], t // A, y, offsets[e],
                   (t // A) * ROWS)


@njit(**OPTS)
def experts_q4r_serial(x, offsets, active, w13, s13, w2, s2, a, y):
    N, D, I = x.shape[0], x.shape[1], a.shape[1]
    Gd, Gi = w13.shape[2], w2.shape[2]
    q = (np.empty((N, D), np.int8), np.empty((N, Gd), F32), np.empty((N, Gd), I32))
    qa = (np.empty((N, I), np.int8), np.empty((N, Gi), F32), np.empty((N, Gi), I32))
    for e in active:
        for m in range(offsets[e], offsets[e + 1]):
            quantize_row(x, m, Gd, q[0], q[1], q[2], m)
        _up_item(q, offsets, e, w13, s13, a, 0, I // ROWS)
        for m in range(offsets[e], offsets[e + 1]):
            quantize_row(a, m, Gi, qa[0], qa[1], qa[2], m)
        for b in range(D // ROWS):
            block_rows(qa[0], qa[1], qa[2], offsets[e], offsets[e + 1], w2[e], s2[e], b, y, offsets[e], b * ROWS)
