"""Int4 weights in the interleaved layout against x in int8 parts (numba; imported by `_jit`).

The layout and the tile are `_simd_q4r`'s (blocks of 16 weight rows, one int32 lane per row); here
x is rounded once per call (`quantize_row`: per group, in P int8 parts, each the rounded residual of
the ones before: P = 1 is Q8_0-style, 2 ~16 bits, 3 ~fp32's 24) and the tiles run over every (block
of 16 weight rows, x row) pair: 4 x rows a tile, then 2, then 1 (3 parts: 4 with AVX-512, 2, then 1), so each
unpacked weight chunk serves up to 4 x rows and each broadcast x chunk 16 weight rows. A call (an
expert) of up to FEW_ROWS x rows takes `few` parts, a longer one `many` (`parts`; `runtime.Q4_X_PARTS_FEW`,
`Q4_X_PARTS`), and reads the scales of its row count (`call_rows`): a copy of one kind of scales
([NB, G, 16] fp16 bits or fp32) gives them to every call; a copy of both ([3·NB, G, 16] int16,
`q4r.Scales.BOTH`) its fp16 head to calls of up to FEW_ROWS rows and its fp32 tail to longer ones.

  linear_q4r(x, w, s, y, few, many)
                                  y [M, Npad] = x [M, K] @ W.T (W: w uint8 [Npad, G, H], s [S·NB, G, 16])
  experts_q4r(x, offsets, active, w13, s13, w2, s2, a, y, few, many, T)
                                  y[rows of e] = (silu(x W1ᵀ)·(x W3ᵀ)) W2ᵀ for each active expert e:
                                  w13 [E, 2I, Gd, Hd] (gate rows, then up rows: blocks of 16 never
                                  straddle the two, I being a multiple of the group), w2 [E, D, Gi, Hi],
                                  their scales [E, S·2I/16, Gd, 16] and [E, S·D/16, Gi, 16]; a [N, I] scratch.
                                  Work items: with one x row an active expert (decode of one
                                  sequence) expert by expert, a w13 item reading a run of gate blocks
                                  then the same run of up blocks (`_up_run`); otherwise interleaving
                                  the experts, so equal shares hold equal work whatever the row counts.
Each has a serial twin (`*_serial`, the same work items on the calling thread).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from moetune.kernels.cpu._jit_experts import silu
from moetune.kernels.cpu._jit_tiles import I0
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._simd_q4r import (PART, ROWS, WIDE, q4r_tile_1, q4r_tile_1p2, q4r_tile_1p3, q4r_tile_2,
                                          q4r_tile_2p2, q4r_tile_2p3, q4r_tile_4, q4r_tile_4p2, q4r_tile_4p3)

F32, I32 = np.float32, np.int32
PART32 = F32(PART)
QMAX = F32(127.0)  # each part of x in int8 (one part: as llama.cpp's Q8_0 rounds its activations)


@njit(**OPTS)
def quantize_row(x, m, G, P, xq, xd, xc, r):
    """xq[r, pK:(p+1)K] = part p < P of row m of x [M, K] as int8 in the chunk order of `_simd_q4r` (per
    group of K/G columns, per 4 bytes of weights: 4 even then 4 odd columns): x ≈ xd[r, g]·Σ_p
    xq_p·254⁻ᵖ, xd[r, g] = absmax(group g) / 127, each part the rounded residual of the ones before
    (|residual| ≤ half a step of the part before: |xq_p| ≤ 127); xc[r, pG + g] = −8·Σ of part p's
    int8 in group g (the nibbles' zero point)."""
    K = x.shape[1]
    gs = K // G
    v = np.empty(gs, F32)  # the group in xq's order, in steps of the part being rounded
    for g in range(G):
        k0 = g * gs
        top = F32(0.0)
        for j in range(gs):
            top = max(top, abs(x[m, k0 + j]))
        inv = QMAX / top if top > 0 else F32(0.0)
        for c in range(gs // 8):  # chunk c: its 4 even columns, then its 4 odd ones
            for i in range(4):
                v[8 * c + i] = x[m, k0 + 8 * c + 2 * i] * inv
                v[8 * c + 4 + i] = x[m, k0 + 8 * c + 2 * i + 1] * inv
        for p in range(P):
            base, total = p * K + k0, 0
            for j in range(gs):
                q = min(max(np.rint(v[j]), -QMAX), QMAX)
                xq[r, base + j] = np.int8(q)
                total += np.int32(q)
                v[j] = (v[j] - q) * PART32
            xc[r, p * G + g] = -8 * total
        xd[r, g] = top / QMAX


@njit(**OPTS)
def block_rows(xq, xd, xc, m0, m1, w, s, nb, out, orow, ocol, P):
    """out[orow + m − m0, ocol:ocol + 16] for the x rows [m0, m1) (P parts each) against weight block nb."""
    m = m0
    if P == 1:
        while m + 4 <= m1:
            q4r_tile_4(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
            m += 4
        if m + 2 <= m1:
            q4r_tile_2(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
            m += 2
        if m < m1:
            q4r_tile_1(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
    elif P == 2:
        while m + 4 <= m1:
            q4r_tile_4p2(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
            m += 4
        if m + 2 <= m1:
            q4r_tile_2p2(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
            m += 2
        if m < m1:
            q4r_tile_1p2(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
    else:
        if WIDE:
            while m + 4 <= m1:
                q4r_tile_4p3(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
                m += 4
        while m + 2 <= m1:
            q4r_tile_2p3(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)
            m += 2
        if m < m1:
            q4r_tile_1p3(xq, xd, xc, m, w, s, nb, out, orow + m - m0, ocol)


FEW_ROWS = 16  # x rows up to which a call (an expert) takes the `few` parts of x, else `many`, and
# in a copy of both kinds of scales the fp16 ones, else the fp32 ones (`call_rows`)


@njit(**OPTS)
def parts(rows, few, many):
    return few if rows <= FEW_ROWS else many


def fp32_scales(s, NB):
    """The fp32 tail [NB, G, 16] of a copy of both kinds of scales s [3·NB, G, 16] int16 (an fp32 copy:
    itself)."""
    raise NotImplementedError("fp32_scales runs inside numba kernels only")


@overload(fp32_scales, jit_options={"fastmath": True})
def _fp32_scales(s, NB):
    if s.dtype == types.int16:
        def tail(s, NB):
            return s[NB:].reshape(NB, s.shape[1], 2 * ROWS).view(np.float32)  # int16 pairs → fp32
        return tail
    return lambda s, NB: s


@njit(**OPTS)
def call_rows(xq, xd, xc, m0, m1, w, s, nb, out, orow, ocol, P, rows):
    """`block_rows` with the scales a call (an expert) of `rows` x rows reads from its copy's s: the
    first NB blocks (fp16 bits or fp32), or past FEW_ROWS rows in a copy of both, the fp32 tail."""
    NB = w.shape[0] // ROWS
    if rows > FEW_ROWS and s.shape[0] > NB:
        block_rows(xq, xd, xc, m0, m1, w, fp32_scales(s, NB), nb, out, orow, ocol, P)
    else:
        block_rows(xq, xd, xc, m0, m1, w, s, nb, out, orow, ocol, P)


@njit(**OPTS)
def _x_buffers(M, K, G, P):
    return np.empty((M, P * K), np.int8), np.empty((M, G), F32), np.empty((M, P * G), I32)


SERIAL_X = 16384  # x elements up to which a call rounds x on the calling thread (a parallel region
# wakes the other threads: more than rounding a few rows costs)


@njit(parallel=True, **OPTS)
def linear_q4r(x, w, s, y, few, many):
    M, K, G = x.shape[0], x.shape[1], w.shape[1]
    P = parts(M, few, many)
    xq, xd, xc = _x_buffers(M, K, G, P)
    if M * K <= SERIAL_X:
        for m in range(M):
            quantize_row(x, m, G, P, xq, xd, xc, m)
    else:
        for m in prange(M):
            quantize_row(x, np.int64(m), G, P, xq, xd, xc, np.int64(m))  # the twin's int64 (`_jit_tiles.I0`)
    for nb in prange(w.shape[0] // ROWS):
        call_rows(xq, xd, xc, I0, M, w, s, np.int64(nb), y, I0, nb * ROWS, P, M)


@njit(**OPTS)
def linear_q4r_serial(x, w, s, y, few, many):
    M, K, G = x.shape[0], x.shape[1], w.shape[1]
    P = parts(M, few, many)
    xq, xd, xc = _x_buffers(M, K, G, P)
    for m in range(M):
        quantize_row(x, m, G, P, xq, xd, xc, m)
    for nb in range(w.shape[0] // ROWS):
        call_rows(xq, xd, xc, I0, M, w, s, nb, y, I0, nb * ROWS, P, M)


@njit(**OPTS)
def _quantize_expert(x, offsets, e, G, few, many, q):
    """The rows of expert e of x into q = (xq, xd, xc), in the parts its row count takes."""
    P = parts(offsets[e + 1] - offsets[e], few, many)
    for m in range(offsets[e], offsets[e + 1]):
        quantize_row(x, m, G, P, q[0], q[1], q[2], m)


UP_BLOCKS = 4  # blocks of 16 activation columns per work item of the w13 pass (one scratch each)


@njit(inline="always", **OPTS)
def _up_item(q, offsets, e, w13, s13, a, b0, b1, few, many):
    """a[rows of e, 16b:16b + 16] = silu(gate)·up of blocks b in [b0, b1) (gate block b, up block I/16 + b)."""
    xq, xd, xc = q
    rows = offsets[e + 1] - offsets[e]
    P = parts(rows, few, many)
    nbi = w13.shape[1] // (2 * ROWS)
    gu = np.empty((4, 2 * ROWS), F32)  # [x rows of a tile, gate | up]
    for b in range(b0, b1):
        for m0 in range(offsets[e], offsets[e + 1], 4):
            m1 = min(offsets[e + 1], m0 + 4)
            call_rows(xq, xd, xc, m0, m1, w13[e], s13[e], b, gu, I0, I0, P, rows)
            call_rows(xq, xd, xc, m0, m1, w13[e], s13[e], nbi + b, gu, I0, I0 + ROWS, P, rows)
            for i in range(m1 - m0):
                for l in range(ROWS):
                    a[m0 + i, b * ROWS + l] = silu(gu[i, l]) * gu[i, ROWS + l]


RUN_BLOCKS = 16  # most blocks of 16 activation columns per work item when the items go expert by expert


@njit(inline="always", **OPTS)
def _up_run(q, offsets, e, w13, s13, a, b0, b1, few, many):
    """`_up_item` reading its gate blocks b0..b1 (≤ RUN_BLOCKS) in one run, then its up blocks in
    another: two long read streams instead of the two alternating every block."""
    xq, xd, xc = q
    rows = offsets[e + 1] - offsets[e]
    P = parts(rows, few, many)
    nbi = w13.shape[1] // (2 * ROWS)
    n = b1 - b0
    gu = np.empty((4, 2 * RUN_BLOCKS * ROWS), F32)  # [x rows of a tile, gate of the run | up of the run]
    for m0 in range(offsets[e], offsets[e + 1], 4):
        m1 = min(offsets[e + 1], m0 + 4)
        for b in range(b0, b1):
            call_rows(xq, xd, xc, m0, m1, w13[e], s13[e], b, gu, I0, (b - b0) * ROWS, P, rows)
        for b in range(b0, b1):
            call_rows(xq, xd, xc, m0, m1, w13[e], s13[e], nbi + b, gu, I0, (n + b - b0) * ROWS, P, rows)
        for i in range(m1 - m0):
            for j in range(n * ROWS):
                a[m0 + i, b0 * ROWS + j] = silu(gu[i, j]) * gu[i, n * ROWS + j]


@njit(**OPTS)
def run_blocks(A, nbi, T):
    """Blocks per work item of the expert-by-expert w13 pass: RUN_BLOCKS, fewer when A experts of nbi
    blocks would then give under two items to each of the T threads (an argument: numba's
    `get_num_threads` in a kernel stops its disk cache)."""
    return max(1, min(RUN_BLOCKS, A * nbi // (2 * T)))


@njit(parallel=True, **OPTS)
def experts_q4r(x, offsets, active, w13, s13, w2, s2, a, y, few, many, T):
    N, D, I, A = x.shape[0], x.shape[1], a.shape[1], active.shape[0]
    Gd, Gi = w13.shape[2], w2.shape[2]
    Pmax = max(few, many)  # an expert's rows take `parts(its rows, few, many)` of the buffers' Pmax
    q, qa = _x_buffers(N, D, Gd, Pmax), _x_buffers(N, I, Gi, Pmax)
    if N * D <= SERIAL_X:
        for e in active:
            _quantize_expert(x, offsets, e, Gd, few, many, q)
    else:
        for t in prange(A):
            _quantize_expert(x, offsets, active[t], Gd, few, many, q)
    nbi, nbd = I // ROWS, D // ROWS
    single = N == A  # one row an active expert (decode of one sequence): equal work, so the items go expert
    # by expert (longer read streams: `_up_run`); else they interleave the experts, so each thread takes a
    # share of every expert whatever its rows
    rb = run_blocks(A, nbi, T) if single else UP_BLOCKS
    nu = (nbi + rb - 1) // rb
    for t in prange(A * nu):
        if single:
            u = t % nu
            _up_run(q, offsets, active[t // nu], w13, s13, a, u * rb, min(nbi, (u + 1) * rb), few, many)
        else:
            u = t // A
            _up_item(q, offsets, active[t % A], w13, s13, a, u * rb, min(nbi, (u + 1) * rb), few, many)
    if N * I <= SERIAL_X:
        for e in active:
            _quantize_expert(a, offsets, e, Gi, few, many, qa)
    else:
        for t in prange(A):
            _quantize_expert(a, offsets, active[t], Gi, few, many, qa)
    for t in prange(A * nbd):
        e, b = (active[t // nbd], t % nbd) if single else (active[t % A], t // A)
        rows = offsets[e + 1] - offsets[e]
        call_rows(qa[0], qa[1], qa[2], offsets[e], offsets[e + 1], w2[e], s2[e], b, y, offsets[e], b * ROWS,
                  parts(rows, few, many), rows)


@njit(**OPTS)
def experts_q4r_serial(x, offsets, active, w13, s13, w2, s2, a, y, few, many, T):
    N, D, I = x.shape[0], x.shape[1], a.shape[1]
    Gd, Gi = w13.shape[2], w2.shape[2]
    Pmax = max(few, many)
    q, qa = _x_buffers(N, D, Gd, Pmax), _x_buffers(N, I, Gi, Pmax)
    for e in active:
        rows = offsets[e + 1] - offsets[e]
        P = parts(rows, few, many)
        _quantize_expert(x, offsets, e, Gd, few, many, q)
        _up_item(q, offsets, e, w13, s13, a, 0, I // ROWS, few, many)
        _quantize_expert(a, offsets, e, Gi, few, many, qa)
        for b in range(D // ROWS):
            call_rows(qa[0], qa[1], qa[2], offsets[e], offsets[e + 1], w2[e], s2[e], b, y, offsets[e], b * ROWS, P,
                      rows)
