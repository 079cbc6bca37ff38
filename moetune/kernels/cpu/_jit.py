"""The numba kernels (imported lazily by `runtime.jit()`, never at package import).

All math is fp32 with fastmath (the k reductions are reassociated into SIMD lanes). Arrays are
numpy views of C-contiguous torch tensors; the wrappers in `linear.py` / `experts.py` check them.

Tile order inside one work item: rows of x in chunks of `M_CHUNK`, then weight rows two at a time,
then x rows four at a time (dense; two or three rows left take a 2 × 2 tile) or two at a time
(int4): a 4 × 2 (2 × 2) tile of accumulators,
so each loaded weight element serves several x rows and each x element two weight rows; the
weight block stays in L1/L2 while the next x chunk reuses it.

Dense rows (fp32 or int8) share one code path: `w[n, k]` widened to fp32, the row's scale applied
once after the reduction (ones for fp32). Int8 rows against a single x row (a projection at M = 1,
an expert with one row) instead take the integer path of `_jit_q8` when the caller asks (`q8`):
x quantised once to int16, int32 dot products. Int4 rows are viewed as [N, G, group/2] bytes and take x
as xq [M, 2, G, group/2] (its even / odd columns, viewed the same way) plus the per-group sums of
x, so that `Σ x·(q - 8) = Σ x·q - 8·Σ x`; a byte b is widened to fp32 once and split there
(hi = floor(b/16), lo = b - 16·hi), which vectorises on AVX2 (integer nibble ops did not). With 3+
x rows in a chunk, two int4 rows are instead widened into an L1 scratch in xq's order and the
dense tile runs on them.

Two rules keep the k loops fast: every inner loop index runs from 0 (numba adds a negative-index
wraparound check to other indices, which stopped LLVM vectorising: 17× slower on the int4 group
loop), and no array view is made per row inside a parallel loop (each view bumps a reference count
that all threads share).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._jit_q8 import (dot1_q, dot2_q, q4_cols, q4_rows, q8_rows, quantize_row,
                                         quantize_row_split, quantize_rows, quantize_single_rows, quantize_split_row,
                                         x_blocks)
from moetune.kernels.cpu._simd import q4_tile_1x2
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._prefetch import prefetch_row
M_CHUNK = 8  # x rows per pass over a block of weight rows (4 x rows × 2 weight rows stay in registers)
AHEAD = 4  # weight rows requested into L2 this many rows ahead (`_prefetch`), where the core spends
SHORT_ROW = 1024  # long on each weight line: 2+ x rows per weight row, or rows of ≤ SHORT_ROW bytes
# (measured: a [32000, 768] linear 1.14-1.30x at 2-16 rows and 0.84x at one; [8192, 256] 1.09x at
# one row; the experts' w13 pass on rows of 3 KB 0.88-0.95x, on rows of 1 KB 1.12-1.16x), or int8
# experts at one row (340M-style decode b=1: steps 1.06x; fp32 rows of 1 KB at one row: 0.96x)
F0, F1, F8, F16, F1_16 = (np.float32(v) for v in (0.0, 1.0, 8.0, 16.0, 0.0625))


# --- two weight rows (n, n2) against x rows [m0, m1): a 4 × 2 register tile -----------------------
# Odd tails pass n2 = n, col2 = col (the row is computed twice, written once).

@njit(**OPTS)
def _dense_rows(x, m0, m1, w, n, n2, s, s2, y, ym0, col, col2):
    """y[ym0 + m - m0, col] = s · Σ_k x[m, k]·w[n, k] (and n2 → col2 with s2) for m in [m0, m1);
    w fp32 or int8 [N, K]."""
    K = w.shape[1]
    m = m0
    while m + 4 <= m1:
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = F0
        for k in range(K):
            u, v = np.float32(w[n, k]), np.float32(w[n2, k])
            x0, x1, x2, x3 = x[m, k], x[m + 1, k], x[m + 2, k], x[m + 3, k]
            a0 += x0 * u
            a1 += x1 * u
            a2 += x2 * u
            a3 += x3 * u
            b0 += x0 * v
            b1 += x1 * v
            b2 += x2 * v
            b3 += x3 * v
        r = ym0 + m - m0
        y[r, col], y[r + 1, col], y[r + 2, col], y[r + 3, col] = a0 * s, a1 * s, a2 * s, a3 * s
        y[r, col2], y[r + 1, col2], y[r + 2, col2], y[r + 3, col2] = b0 * s2, b1 * s2, b2 * s2, b3 * s2
        m += 4
    if m + 2 <= m1:  # two or three rows left: a 2 × 2 tile (each row alone would re-read both weight rows)
        a0 = a1 = b0 = b1 = F0
        for k in range(K):
            u, v = np.float32(w[n, k]), np.float32(w[n2, k])
            x0, x1 = x[m, k], x[m + 1, k]
            a0 += x0 * u
            a1 += x1 * u
            b0 += x0 * v
            b1 += x1 * v
        r = ym0 + m - m0
        y[r, col], y[r + 1, col] = a0 * s, a1 * s
        y[r, col2], y[r + 1, col2] = b0 * s2, b1 * s2
        m += 2
    while m < m1:  # one x row: a plain dot per weight row (one stream each; 1.5x the joint loop's rate)
        y[ym0 + m - m0, col] = _dot(x, m, w, n) * s
        if n2 != n or col2 != col:
            y[ym0 + m - m0, col2] = _dot(x, m, w, n2) * s2
        m += 1


@njit(**OPTS)
def _dot(x, m, w, n):
    """Σ_k x[m, k]·w[n, k] in fp32 (w fp32 or int8)."""
    acc = F0
    for k in range(w.shape[1]):
        acc += x[m, k] * np.float32(w[n, k])
    return acc


@njit(**OPTS)
def _int4_rows(xq, xs, m0, m1, w, n, n2, s, y, ym0, col, col2):
    """y[ym0 + m - m0, col] = Σ_g s[n, g] · Σ_{k in g} x[m, k]·(q[n, k] - 8), and n2 → col2;
    w [N, G, group/2] u8, xq [M, 2, G, group/2] the even (0) / odd (1) columns of x, xs [M, G]
    its group sums. Two x rows at a time (the nibble split costs as much as the FMAs), then the odd one."""
    G, H = w.shape[1], w.shape[2]
    m = m0
    while m + 2 <= m1:
        t0 = t1 = u0 = u1 = F0
        for g in range(G):
            a0 = a1 = b0 = b1 = F0
            for j in range(H):
                f, h = np.float32(w[n, g, j]), np.float32(w[n2, g, j])
                fhi, hhi = np.floor(f * F1_16), np.floor(h * F1_16)
                flo, hlo = f - F16 * fhi, h - F16 * hhi
                e0, o0, e1, o1 = xq[m, 0, g, j], xq[m, 1, g, j], xq[m + 1, 0, g, j], xq[m + 1, 1, g, j]
                a0 += e0 * flo + o0 * fhi
                a1 += e1 * flo + o1 * fhi
                b0 += e0 * hlo + o0 * hhi
                b1 += e1 * hlo + o1 * hhi
            c0, c1 = F8 * xs[m, g], F8 * xs[m + 1, g]
            t0 += s[n, g] * (a0 - c0)
            t1 += s[n, g] * (a1 - c1)
            u0 += s[n2, g] * (b0 - c0)
            u1 += s[n2, g] * (b1 - c1)
        r = ym0 + m - m0
        y[r, col], y[r, col2], y[r + 1, col], y[r + 1, col2] = t0, u0, t1, u1
        m += 2
    if m < m1:
        t0 = u0 = F0
        for g in range(G):
            a0 = b0 = F0
            for j in range(H):
                f, h = np.float32(w[n, g, j]), np.float32(w[n2, g, j])
                fhi, hhi = np.floor(f * F1_16), np.floor(h * F1_16)
                e0, o0 = xq[m, 0, g, j], xq[m, 1, g, j]
                a0 += e0 * (f - F16 * fhi) + o0 * fhi
                b0 += e0 * (h - F16 * hhi) + o0 * hhi
            t0 += s[n, g] * (a0 - F8 * xs[m, g])
            u0 += s[n2, g] * (b0 - F8 * xs[m, g])
        y[ym0 + m - m0, col], y[ym0 + m - m0, col2] = t0, u0


@njit(**OPTS)
def _int4_dequant(w, n, s, out, r):
    """out[r] = row n of w in fp32, scale applied, in the [2, G, group/2] even / odd order of xq."""
    G, H = w.shape[1], w.shape[2]
    for g in range(G):
        sg = s[n, g]
        for j in range(H):
            f = np.float32(w[n, g, j])
            hi = np.floor(f * F1_16)
            out[r, 0, g, j] = (f - F16 * hi - F8) * sg
            out[r, 1, g, j] = (hi - F8) * sg


@njit(**OPTS)
def _int4_tile(xq, xs, m0, m1, w, n, n2, s, deq, y, ym0, col, col2):
    """`_int4_rows`, or for 3+ x rows: widen rows n, n2 once into `deq` [2, 2, G, group/2] (L1)
    and run the dense 4 × 2 tile on them (the nibble split is then paid once per 8 x rows)."""
    if m1 - m0 < 3:
        _int4_rows(xq, xs, m0, m1, w, n, n2, s, y, ym0, col, col2)
        return
    _int4_dequant(w, n, s, deq, 0)
    _int4_dequant(w, n2, s, deq, 1)
    M, K = xq.shape[0], 2 * w.shape[1] * w.shape[2]
    _dense_rows(xq.reshape(M, K), m0, m1, deq.reshape(2, K), 0, 1, F1, F1, y, ym0, col, col2)


# --- small-M linear ------------------------------------------------------------------------------

@njit(**OPTS)
def _linear_block(x, w, scale, y, block, b):
    """Rows [b·block, (b+1)·block) of W against every row of x (one work item of `linear_dense`)."""
    M, N = x.shape[0], w.shape[0]
    ahead = M > 1 or w.shape[1] * w.itemsize <= SHORT_ROW
    n1 = min(N, (b + 1) * block)
    for mc in range(0, M, M_CHUNK):
        for n in range(b * block, n1, 2):
            n2 = min(n + 1, n1 - 1)
            if ahead and mc == 0 and n + AHEAD + 1 < N:
                prefetch_row(w, n + AHEAD)
                prefetch_row(w, n + AHEAD + 1)
            _dense_rows(x, mc, min(M, mc + M_CHUNK), w, n, n2, scale[n], scale[n2], y, mc, n, n2)


@njit(parallel=True, **OPTS)
def linear_dense(x, w, scale, y, block):
    """x [M, K] fp32, w [N, K] fp32|int8, scale [N] fp32 → y [M, N]; prange over blocks of N."""
    for b in prange((w.shape[0] + block - 1) // block):
        _linear_block(x, w, scale, y, block, b)


@njit(**OPTS)
def linear_dense_serial(x, w, scale, y, block):
    for b in range((w.shape[0] + block - 1) // block):
        _linear_block(x, w, scale, y, block, b)


@njit(**OPTS)
def _q8_block(xq, xs, w, scale, y, block, b):
    """Rows of block b of W against every row of x, in integers (one work item of `linear_q8`):
    one weight row at a time for one x row, else 4 × 2 tiles (`q8_rows`) per chunk of x rows."""
    M, N = xq.shape[0], w.shape[0]
    n1 = min(N, (b + 1) * block)
    if M == 1:
        ahead = w.shape[1] <= SHORT_ROW
        for n in range(b * block, n1):  # one weight row at a time: one stream (A/B: docs/cpu.md)
            if ahead and n + AHEAD < N:
                prefetch_row(w, n + AHEAD)
            y[0, n] = dot1_q(xq, xs, 0, w, n) * scale[n]
        return
    for mc in range(0, M, M_CHUNK):
        for n in range(b * block, n1, 2):
            n2 = min(n + 1, n1 - 1)
            if mc == 0 and n + AHEAD + 1 < N:
                prefetch_row(w, n + AHEAD)
                prefetch_row(w, n + AHEAD + 1)
            q8_rows(xq, xs, mc, min(M, mc + M_CHUNK), w, n, n2, scale[n], scale[n2], y, n, n2)


@njit(**OPTS)
def _q8_input(x):
    """x [M, K] fp32 → (xq [M, K] int16, xs [M, x_blocks(K)] its block scales)."""
    xq = np.empty(x.shape, np.int16)
    xs = np.empty((x.shape[0], x_blocks(x.shape[1])), np.float32)
    quantize_rows(x, xq, xs)
    return xq, xs


@njit(parallel=True, **OPTS)
def linear_q8(x, w, scale, y, block):
    """x [M, K] fp32, w [N, K] int8, scale [N] fp32 → y [M, N], x quantised to int16 once per call (`_jit_q8`)."""
    xq, xs = _q8_input(x)
    for b in prange((w.shape[0] + block - 1) // block):
        _q8_block(xq, xs, w, scale, y, block, b)


@njit(**OPTS)
def linear_q8_serial(x, w, scale, y, block):
    xq, xs = _q8_input(x)
    for b in range((w.shape[0] + block - 1) // block):
        _q8_block(xq, xs, w, scale, y, block, b)


@njit(**OPTS)
def _q4_input(x, w):
    """x [M, K] fp32 → (xq [M, 2, G, H] int16 in the int4 order of w [N, G, H], group sums, xs [M, G])."""
    xq = np.empty((x.shape[0], 2, w.shape[1], w.shape[2]), np.int16)
    sums = np.empty((x.shape[0], w.shape[1]), np.int32)
    xs = np.empty((x.shape[0], w.shape[1]), np.float32)
    for m in range(x.shape[0]):
        quantize_row_split(x, m, xq, sums, xs, m)
    return xq, sums, xs


@njit(**OPTS)
def _q4_block(q, w, scale, y, block, b):
    """Rows of block b of int4 W, two at a time, against every row of x in integers (one work item
    of `linear_q4`; q = (xq, sums, xs) from `_q4_input`)."""
    xq, sums, xs = q
    n1 = min(w.shape[0], (b + 1) * block)
    if xq.shape[0] == 1:
        q4_cols(xq, sums, xs, 0, w, b * block, n1, scale, y, 0)
        return
    for n in range(b * block, n1, 2):
        n2 = min(n + 1, n1 - 1)
        for m in range(xq.shape[0]):
            q4_rows(xq, sums, xs, m, w, n, n2, scale, y, m, n, n2)


@njit(parallel=True, **OPTS)
def linear_q4(x, w, scale, y, block):
    """x [M, K] fp32, w [N, G, H] uint8 int4, scale [N, G] → y [M, N]: x rounded to int16 per row,
    each group's nibbles against it in integers, one fp32 scale per group (`_simd.q4_row`)."""
    q = _q4_input(x, w)
    for b in prange((w.shape[0] + block - 1) // block):
        _q4_block(q, w, scale, y, block, b)


@njit(**OPTS)
def linear_q4_serial(x, w, scale, y, block):
    q = _q4_input(x, w)
    for b in range((w.shape[0] + block - 1) // block):
        _q4_block(q, w, scale, y, block, b)


@njit(**OPTS)
def _linear_int4_block(xq, xs, w, scale, y, block, b):
    M, N = xq.shape[0], w.shape[0]
    deq = np.empty((2, 2, w.shape[1], w.shape[2]), np.float32)
    n1 = min(N, (b + 1) * block)
    for mc in range(0, M, M_CHUNK):
        for n in range(b * block, n1, 2):
            n2 = min(n + 1, n1 - 1)
            _int4_tile(xq, xs, mc, min(M, mc + M_CHUNK), w, n, n2, scale, deq, y, mc, n, n2)


@njit(parallel=True, **OPTS)
def linear_int4(xq, xs, w, scale, y, block):
    """xq [M, 2, G, group/2], xs [M, G] (see `_int4_rows`); w [N, G, group/2] u8, scale [N, G]."""
    for b in prange((w.shape[0] + block - 1) // block):
        _linear_int4_block(xq, xs, w, scale, y, block, b)


@njit(**OPTS)
def _linear_int4_serial(xq, xs, w, scale, y, block):
    for b in range((w.shape[0] + block - 1) // block):
        _linear_int4_block(xq, xs, w, scale, y, block, b)


# --- grouped experts: w13 → SiLU(gate)·up → w2 ---------------------------------------------------

@njit(**OPTS)
def _dot3(x, m, w, e, n):
    """Σ_k x[m, k]·w[e, n, k] in fp32 (w fp32 or int8 [E, N, K]; indexed in place, no view)."""
    acc = F0
    for k in range(w.shape[2]):
        acc += x[m, k] * np.float32(w[e, n, k])
    return acc


@njit(**OPTS)
def _silu(g):
    return g / (np.float32(1.0) + np.exp(-g))


@njit(**OPTS)
def _up_cols(x, offsets, e, w13, s13, a, j0, j1, gu, xq, xs):
    """a[m, j] = silu(s13[e, j]·x[m]·w13[e, j]) · s13[e, I+j]·x[m]·w13[e, I+j] for the rows m of
    expert e and the columns j in [j0, j1); gu [M_CHUNK, 2] scratch (gate, up of one column).
    xq, xs: x's rows in int16 and their scales where the integer path is on (else empty)."""
    I = w13.shape[1] // 2
    m0, m1 = offsets[e], offsets[e + 1]
    if m1 - m0 == 1:  # one row (decode): plain dots, one view per call
        we = w13[e]
        ahead = we.itemsize == 1  # int8: widening each byte is enough work per line to fall behind
        q8 = xq.shape[0] > 0 and we.itemsize == 1
        for j in range(j0, j1):
            if ahead and j + AHEAD < I:
                prefetch_row(we, j + AHEAD)
                prefetch_row(we, I + j + AHEAD)
            if q8:
                t = dot2_q(xq, xs, m0, we, j, I + j)
                a[m0, j] = _silu(t[0] * s13[e, j]) * (t[1] * s13[e, I + j])
            else:
                g = _dot3(x, m0, w13, e, j) * s13[e, j]
                a[m0, j] = _silu(g) * _dot3(x, m0, w13, e, I + j) * s13[e, I + j]
        return
    we, se = w13[e], s13[e]  # one view per call
    ahead = we.shape[1] * we.itemsize <= SHORT_ROW
    for mc in range(m0, m1, M_CHUNK):
        me = min(m1, mc + M_CHUNK)
        for j in range(j0, j1):
            if ahead and mc == m0 and j + AHEAD < I:
                prefetch_row(we, j + AHEAD)
                prefetch_row(we, I + j + AHEAD)
            _dense_rows(x, mc, me, we, j, I + j, se[j], se[I + j], gu, 0, 0, 1)
            for i in range(me - mc):
                a[mc + i, j] = _silu(gu[i, 0]) * gu[i, 1]


@njit(**OPTS)
def _down_cols(a, offsets, e, w2, s2, y, n0, n1, aq, as_):
    """y[m, n] = s2[e, n]·a[m]·w2[e, n] for the rows m of expert e and the columns n in [n0, n1)
    (aq, as_: a's rows in int16 where the integer path is on, as for `_up_cols`)."""
    m0, m1 = offsets[e], offsets[e + 1]
    if m1 - m0 == 1:
        we = w2[e]
        ahead = we.itemsize == 1
        q8 = aq.shape[0] > 0 and we.itemsize == 1
        for n in range(n0, n1):
            if ahead and n + AHEAD < we.shape[0]:
                prefetch_row(we, n + AHEAD)
            if q8:  # one weight row at a time, as `_q8_block` at one x row
                y[m0, n] = dot1_q(aq, as_, m0, we, n) * s2[e, n]
            else:
                y[m0, n] = _dot3(a, m0, w2, e, n) * s2[e, n]
        return
    we, se = w2[e], s2[e]
    ahead = we.shape[1] * we.itemsize <= SHORT_ROW
    for mc in range(m0, m1, M_CHUNK):
        me = min(m1, mc + M_CHUNK)
        for n in range(n0, n1, 2):
            n2 = min(n + 1, n1 - 1)
            if ahead and mc == m0 and n + AHEAD + 1 < we.shape[0]:
                prefetch_row(we, n + AHEAD)
                prefetch_row(we, n + AHEAD + 1)
            _dense_rows(a, mc, me, we, n, n2, se[n], se[n2], y, mc, n, n2)


@njit(parallel=True, **OPTS)
def _experts_split(x, offsets, active, w13, s13, w2, s2, a, y, block13, block2, q):
    """Work items (active expert, block of columns): every thread reads part of every expert, with
    a barrier between the w13 and the w2 pass. Items are block-major, so the static split of the
    `omp` layer gives each thread the same share of every expert whatever their row counts.
    q = (xq, xs, aq, as_): the one-row experts' rows in int16 (empty arrays: the fp32 path)."""
    I, D = w2.shape[2], w2.shape[1]
    A = active.shape[0]
    xq, xs, aq, as_ = q
    if xq.shape[0] > 0:
        quantize_single_rows(x, offsets, active, xq, xs)
    nb13 = (I + block13 - 1) // block13
    for t in prange(A * nb13):
        e, b = active[t % A], t // A
        gu = np.empty((M_CHUNK, 2), np.float32)
        _up_cols(x, offsets, e, w13, s13, a, b * block13, min(I, (b + 1) * block13), gu, xq, xs)
    if aq.shape[0] > 0:
        quantize_single_rows(a, offsets, active, aq, as_)
    nb2 = (D + block2 - 1) // block2
    for t in prange(A * nb2):
        e, b = active[t % A], t // A
        _down_cols(a, offsets, e, w2, s2, y, b * block2, min(D, (b + 1) * block2), aq, as_)


@njit(parallel=True, **OPTS)
def _experts_lanes(x, offsets, order, lanes, w13, s13, w2, s2, a, y, block13, block2, q):
    """Whole experts: lane l (one per thread) computes experts order[lanes[l]:lanes[l+1]] from w13
    to w2 alone, so no barrier stops the weight stream between the two passes. Column blocks as in
    `_experts_split`, so a second chunk of rows re-reads a block from L2, not from memory."""
    for lane in prange(lanes.shape[0] - 1):
        _lane(x, offsets, order[lanes[lane]:lanes[lane + 1]], w13, s13, w2, s2, a, y, block13, block2, q)


@njit(**OPTS)
def _lane(x, offsets, experts, w13, s13, w2, s2, a, y, block13, block2, q):
    """Experts `experts`, one after the other, each w13 then w2, on the calling thread (q: as for
    `_experts_split`; a one-row expert's rows are quantised right before the pass that reads them)."""
    I, D = w2.shape[2], w2.shape[1]
    xq, xs, aq, as_ = q
    gu = np.empty((M_CHUNK, 2), np.float32)
    for e in experts:
        single = offsets[e + 1] - offsets[e] == 1
        if single and xq.shape[0] > 0:
            quantize_row(x, offsets[e], xq, xs, offsets[e])
        for j in range(0, I, block13):
            _up_cols(x, offsets, e, w13, s13, a, j, min(I, j + block13), gu, xq, xs)
        if single and aq.shape[0] > 0:
            quantize_row(a, offsets[e], aq, as_, offsets[e])
        for n in range(0, D, block2):
            _down_cols(a, offsets, e, w2, s2, y, n, min(D, n + block2), aq, as_)


@njit(**OPTS)
def plan_lanes(offsets, active, lanes_n):
    """(order, lanes): the active experts dealt to `lanes_n` lanes whose expert counts differ by at
    most one (the weights to read decide most of the time), most rows first, each to the lane with
    the fewest rows so far that still has room; lane l takes order[lanes[l]:lanes[l+1]]."""
    A = active.shape[0]
    lanes = np.zeros(lanes_n + 1, np.int64)
    for lane in range(lanes_n):
        lanes[lane + 1] = lanes[lane] + A // lanes_n + (1 if lane < A % lanes_n else 0)
    rows = np.empty(A, np.int64)
    for i in range(A):
        rows[i] = offsets[active[i] + 1] - offsets[active[i]]
    load = np.zeros(lanes_n, np.int64)
    fill = lanes[:-1].copy()
    order = np.empty(A, np.int64)
    for i in np.argsort(-rows, kind="mergesort"):
        best = -1
        for lane in range(lanes_n):
            if fill[lane] < lanes[lane + 1] and (best < 0 or load[lane] < load[best]):
                best = lane
        order[fill[best]] = active[i]
        fill[best] += 1
        load[best] += rows[i]
    return order, lanes


@njit(**OPTS)
def offsets_fit(offsets, n_rows):
    """Whether offsets [E+1] are non-decreasing within [0, n_rows]."""
    if offsets[0] < 0 or offsets[-1] > n_rows:
        return False
    for e in range(offsets.shape[0] - 1):
        if offsets[e + 1] < offsets[e]:
            return False
    return True


@njit(**OPTS)
def active_experts(offsets, n_rows):
    """The experts with rows ([A] int64, in id order), or [-1] when the offsets do not fit."""
    if not offsets_fit(offsets, n_rows):
        return np.full(1, -1, np.int64)
    A = 0
    for e in range(offsets.shape[0] - 1):
        A += offsets[e + 1] > offsets[e]
    active = np.empty(A, np.int64)
    A = 0
    for e in range(offsets.shape[0] - 1):
        if offsets[e + 1] > offsets[e]:
            active[A] = e
            A += 1
    return active


@njit(**OPTS)
def q8_scratch(x, a, on):
    """(xq, xs, aq, as_): int16 rows of x [N, D] and a [N, I] with their block scales for the integer
    path, or empty arrays (the fp32 path) when not `on`."""
    N = x.shape[0] if on else 0
    return (np.empty((N, x.shape[1]), np.int16), np.empty((N, x_blocks(x.shape[1])), np.float32),
            np.empty((N, a.shape[1]), np.int16), np.empty((N, x_blocks(a.shape[1])), np.float32))


@njit(**OPTS)
def experts_dense(x, offsets, active, w13, s13, w2, s2, a, y, block13, block2, schedule, T, q8=0):
    """x [N, D]; offsets [E+1]; active [A] experts to compute; w13 [E, 2I, D], s13 [E, 2I];
    w2 [E, D, I], s2 [E, D]; a [N, I] scratch; y [N, D]; T the threads of this call (numba's
    `get_num_threads` in here would stop the disk cache; T = 1: everything on the calling thread,
    no parallel region, whatever the schedule). `schedule` 0: whole experts per thread when they
    split evenly over the threads (A a multiple of T) or there are at least 4 per thread (one more
    on some threads is then at most a quarter more), else column blocks; 1: always column blocks;
    2: always whole experts (lanes whose counts differ by one). q8: int8 experts with one row take
    the integer path (`_jit_q8`)."""
    A = active.shape[0]
    q = q8_scratch(x, a, q8 > 0 and w13.itemsize == 1)
    if T == 1:
        _lane(x, offsets, active, w13, s13, w2, s2, a, y, block13, block2, q)
        return
    if schedule == 1 or (schedule == 0 and A % T != 0 and A < 4 * T):
        _experts_split(x, offsets, active, w13, s13, w2, s2, a, y, block13, block2, q)
        return
    order, lanes = plan_lanes(offsets, active, max(1, min(T, A)))
    _experts_lanes(x, offsets, order, lanes, w13, s13, w2, s2, a, y, block13, block2, q)


# The int4 work items are inlined into their drivers: called as functions they ran 10-19 % slower.

@njit(inline="always", **OPTS)
def _int4_up_item(xq, xs, offsets, e, w13, s13, aq, j0, j1, q):
    """Columns [j0, j1) of expert e's activation, written into aq's split layout. q = (xq16, xsum,
    xsc, ..., rows): an expert of at most `rows` rows reads x in integers (`_simd.q4_tile_1x2`)."""
    Hi = aq.shape[3]
    I = w13.shape[1] // 2
    we, se = w13[e], s13[e]
    xq16, xsum, xsc, rows = q[0], q[1], q[2], q[6]
    if offsets[e + 1] - offsets[e] <= rows:
        for j in range(j0, j1):
            for m in range(offsets[e], offsets[e + 1]):
                t = q4_tile_1x2(xq16, xsum, xsc, m, we, j, I + j, se)
                aq[m, j % 2, (j // 2) // Hi, (j // 2) % Hi] = _silu(t[0]) * t[1]
        return
    gu = np.empty((M_CHUNK, 2), np.float32)
    deq = np.empty((2, 2, we.shape[1], we.shape[2]), np.float32)
    for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
        m1 = min(offsets[e + 1], mc + M_CHUNK)
        for j in range(j0, j1):
            _int4_tile(xq, xs, mc, m1, we, j, I + j, se, deq, gu, 0, 0, 1)
            for i in range(m1 - mc):
                aq[mc + i, j % 2, (j // 2) // Hi, (j // 2) % Hi] = _silu(gu[i, 0]) * gu[i, 1]


@njit(inline="always", **OPTS)
def _int4_group_sums(aq, asum, m, q):
    for g in range(aq.shape[2]):
        acc = F0
        for j in range(aq.shape[3]):
            acc += aq[m, 0, g, j] + aq[m, 1, g, j]
        asum[m, g] = acc
    if q[3].shape[0] > 0:
        quantize_split_row(aq, m, q[3], q[4], q[5])


@njit(inline="always", **OPTS)
def _int4_down_item(aq, asum, offsets, e, w2, s2, y, n0, n1, q):
    we, se = w2[e], s2[e]
    if offsets[e + 1] - offsets[e] == 1 and q[6] >= 1:
        q4_cols(q[3], q[4], q[5], offsets[e], we, n0, n1, se, y, offsets[e])
        return
    if offsets[e + 1] - offsets[e] <= q[6]:
        for n in range(n0, n1, 2):
            n2 = min(n + 1, n1 - 1)
            for m in range(offsets[e], offsets[e + 1]):
                q4_rows(q[3], q[4], q[5], m, we, n, n2, se, y, m, n, n2)
        return
    deq = np.empty((2, 2, we.shape[1], we.shape[2]), np.float32)
    for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
        m1 = min(offsets[e + 1], mc + M_CHUNK)
        for n in range(n0, n1, 2):
            n2 = min(n + 1, n1 - 1)
            _int4_tile(aq, asum, mc, m1, we, n, n2, se, deq, y, mc, n, n2)


@njit(**OPTS)
def q4_scratch(xq, aq, rows):
    """(xq16, xsum, xsc, aq16, asum16, asc, rows): int16 copies of x and the activation (split
    layout) with their group sums and group scales for the integer path of experts of ≤ rows rows,
    or empty arrays (rows 0: the fp32 path)."""
    N = xq.shape[0] if rows > 0 else 0
    return (np.empty((N, 2, xq.shape[2], xq.shape[3]), np.int16), np.empty((N, xq.shape[2]), np.int32),
            np.empty((N, xq.shape[2]), np.float32), np.empty((N, 2, aq.shape[2], aq.shape[3]), np.int16),
            np.empty((N, aq.shape[2]), np.int32), np.empty((N, aq.shape[2]), np.float32), rows if N > 0 else 0)


@njit(parallel=True, **OPTS)
def experts_int4(xq, xs, offsets, active, w13, s13, w2, s2, aq, asum, y, block13, block2, rows=0):
    """Int4 twin of `experts_dense`: w13 [E, 2I, Gd, Hd], w2 [E, D, Gi, Hi] u8; x split as for
    `linear_int4`; the activation is written straight into the same split layout
    (aq [N, 2, Gi, Hi]) and its group sums asum [N, Gi] are filled before the w2 pass. Items
    block-major, as in `_experts_split`. rows: experts of at most this many rows take the integer
    path (x and the activation rounded to int16 per row, `q4_scratch`; 0: never)."""
    D, I, A = w2.shape[1], w13.shape[1] // 2, active.shape[0]
    nb13, nb2 = (I + block13 - 1) // block13, (D + block2 - 1) // block2
    q = q4_scratch(xq, aq, rows)
    for m in prange(q[0].shape[0]):
        quantize_split_row(xq, m, q[0], q[1], q[2])
    for t in prange(A * nb13):
        e, b = active[t % A], t // A
        _int4_up_item(xq, xs, offsets, e, w13, s13, aq, b * block13, min(I, (b + 1) * block13), q)
    for m in prange(aq.shape[0]):
        _int4_group_sums(aq, asum, m, q)
    for t in prange(A * nb2):
        e, b = active[t % A], t // A
        _int4_down_item(aq, asum, offsets, e, w2, s2, y, b * block2, min(D, (b + 1) * block2), q)


@njit(**OPTS)
def _experts_int4_serial(xq, xs, offsets, active, w13, s13, w2, s2, aq, asum, y, block13, block2, rows=0):
    D, I = w2.shape[1], w13.shape[1] // 2
    q = q4_scratch(xq, aq, rows)
    for m in range(q[0].shape[0]):
        quantize_split_row(xq, m, q[0], q[1], q[2])
    for e in active:
        _int4_up_item(xq, xs, offsets, e, w13, s13, aq, 0, I, q)
    for m in range(aq.shape[0]):
        _int4_group_sums(aq, asum, m, q)
    for e in active:
        _int4_down_item(aq, asum, offsets, e, w2, s2, y, 0, D, q)


# --- paged decode attention: one query token per sequence, keys/values read through block tables ---

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


# --- the serial twins: the same work items, looped on the calling thread -------------------------
# `runtime.launch` hands these out for calls too small to wake a second thread, instead of
# switching numba's thread count to 1 and back (three numba calls, ~25 µs on a decode step's flushed
# caches). experts_dense takes the thread count as an argument and needs no twin.

SERIAL = False
serial = SimpleNamespace(SERIAL=True, linear_dense=linear_dense_serial, linear_int4=_linear_int4_serial,
                         linear_q8=linear_q8_serial, linear_q4=linear_q4_serial,
                         experts_dense=experts_dense, experts_int4=_experts_int4_serial,
                         decode_attention=decode_attention_serial)
