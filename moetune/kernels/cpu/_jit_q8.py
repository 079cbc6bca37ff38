"""The integer primitives of int8 / int4 weight rows against rounded x rows (numba; imported by `_jit`).

Against a few x rows the fp32 path of `_jit` (each int8 byte widened to fp32, then an FMA) runs at
the rate of its conversions, below the read limit. Here each x row is quantised once per call to
int16, and each weight row is a run of integer dot products: `int16 · int8 → int32` pairs summed by
`_simd`'s tiles (`vpmaddwd`, VNNI's `vpdpwssd` where present), 32 (AVX-512) or 16 (AVX2)
multiply-adds per instruction and no conversion per weight.

Numerics: x is rounded per block of columns, each block with its own scale — XB = 64 columns
against int8 weights (llama.cpp's Q8_0 activations take 32: at 16 rows that cost 1.7x the per-row
kernel's time, 64 1.25-1.4x, docs/cpu.md), the weight's group against int4 —
x[k] ≈ xq[k]·xs_b with xs_b = absmax(block b) / 32767, |x[k] − xq[k]·xs_b| ≤ xs_b / 2 (15 bits of
every block; an int32 block sum of ≤ 128·32767·127 cannot overflow; each lane's block sum, ≤ 4
products on AVX-512, converts to fp32 exactly).
y[n] = scale[n] · Σ_b xs_b · float(Σ_{k in b} xq[k]·w[n, k]), so y differs from the fp32 path by
at most Σ_b (xs_b / 2)·Σ_{k in b} |W[n, k]| (plus fp32 rounding), which the twin tests check.
A block never spans two ranks' slices of a row when each slice is a multiple of the block
(`linear.x_block_aligned`), so every tensor-parallel mesh rounds x exactly as one rank does.

Used by `_jit`: `linear_q8`, the int8 experts' one-row passes (`_up_cols`, `_down_cols`: each row
quantised once per call, before the pass that reads it), `linear_q4` and the int4 experts.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._simd import (XB, q4_tile_1x1, q4_tile_2x1, q4_tile_4x1, q8_tile_1x1, q8_tile_1x2,
                                      q8_tile_2x2, q8_tile_4x2)

I32, F32 = np.int32, np.float32
QMAX = F32(32767.0)  # |xq| ≤ this: an int32 block sum of XB ≤ 128 products (≤ 128·32767·127) cannot overflow


@njit(**OPTS)
def x_blocks(K):
    """Scales per x row of K columns against int8 weights: one per XB columns (the last block may be short)."""
    return (K + XB - 1) // XB


@njit(**OPTS)
def _q16(v, inv):
    """v·inv rounded to int16 (|v·inv| ≤ 32767 by the caller's choice of inv)."""
    return np.int16(min(max(np.rint(v * inv), -QMAX), QMAX))


@njit(**OPTS)
def quantize_row(x, m, out, scales, r):
    """out[r] = row m of x [M, K] fp32 as int16, each block of XB columns with its own scale
    scales[r, b] = absmax(block) / 32767 (round to nearest)."""
    K = x.shape[1]
    for b in range(x_blocks(K)):
        k0, k1 = b * XB, min(K, (b + 1) * XB)
        top = F32(0.0)
        for k in range(k1 - k0):
            top = max(top, abs(x[m, k0 + k]))
        inv = QMAX / top if top > 0 else F32(0.0)
        for k in range(k1 - k0):
            out[r, k0 + k] = _q16(x[m, k0 + k], inv)
        scales[r, b] = top / QMAX


@njit(**OPTS)
def quantize_rows(x, xq, xs):
    """xq [M, K] int16, xs [M, x_blocks(K)]: every row of x [M, K] as `quantize_row` rounds it."""
    for m in range(x.shape[0]):
        quantize_row(x, m, xq, xs, m)


def dot2_q(xq, xs, m, w, n, n2):
    """(Σ_k x[m, k]·w[n, k], the same for n2) with x as `quantize_row` rounds it (xq, xs): for int8 w
    `_simd.q8_tile_1x2`; other dtypes type as plain loops (branches compiled for fp32 weights, never taken)."""
    raise NotImplementedError("dot2_q runs inside numba kernels only")


@overload(dot2_q, jit_options={"fastmath": True})
def _dot2_q(xq, xs, m, w, n, n2):
    if w.dtype == types.int8 and w.layout == "C":
        return lambda xq, xs, m, w, n, n2: q8_tile_1x2(xq, xs, m, w, n, n2)

    def loop(xq, xs, m, w, n, n2):
        a = b = F32(0.0)
        for k in range(w.shape[1]):
            xk = F32(xq[m, k]) * xs[m, k // XB]
            a += xk * F32(w[n, k])
            b += xk * F32(w[n2, k])
        return a, b
    return loop


def dot1_q(xq, xs, m, w, n):
    """`dot2_q` for one weight row."""
    raise NotImplementedError("dot1_q runs inside numba kernels only")


@overload(dot1_q, jit_options={"fastmath": True})
def _dot1_q(xq, xs, m, w, n):
    if w.dtype == types.int8 and w.layout == "C":
        return lambda xq, xs, m, w, n: q8_tile_1x1(xq, xs, m, w, n, n)[0]

    def loop(xq, xs, m, w, n):
        a = F32(0.0)
        for k in range(w.shape[1]):
            a += F32(xq[m, k]) * xs[m, k // XB] * F32(w[n, k])
        return a
    return loop


def q8_rows(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
    """y[m, col] = s·Σ_k x[m, k]·w[n, k] (and n2 → col2 with s2) for m in [m0, m1), x as
    `quantize_row` rounds it: for int8 w `q8_tiles`; other dtypes type as plain loops."""
    raise NotImplementedError("q8_rows runs inside numba kernels only")


@overload(q8_rows, jit_options={"fastmath": True})
def _q8_rows(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
    if w.dtype == types.int8 and w.layout == "C":
        return lambda xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2: q8_tiles(xq, xs, m0, m1, w, n, n2, s, s2, y,
                                                                              col, col2)

    def loop(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
        for m in range(m0, m1):
            a, b = dot2_q(xq, xs, m, w, n, n2)
            y[m, col], y[m, col2] = a * s, b * s2
    return loop


@njit(**OPTS)
def _put(t, rows, m, s, s2, y, col, col2):
    """y[m + i, col], y[m + i, col2] = tile sums t (row-major, 2 per x row) times the weight rows' scales."""
    for i in range(rows):
        y[m + i, col] = t[2 * i] * s
        y[m + i, col2] = t[2 * i + 1] * s2


@njit(**OPTS)
def q8_tiles(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
    """`q8_rows` for int8 w: 4 × 2 integer tiles, then 2 × 2, then 1 × 2 (odd tails pass n2 = n:
    computed twice, written once)."""
    m = m0
    while m + 4 <= m1:
        _put(q8_tile_4x2(xq, xs, m, w, n, n2), 4, m, s, s2, y, col, col2)
        m += 4
    if m + 2 <= m1:
        _put(q8_tile_2x2(xq, xs, m, w, n, n2), 2, m, s, s2, y, col, col2)
        m += 2
    if m < m1:
        _put(q8_tile_1x2(xq, xs, m, w, n, n2), 1, m, s, s2, y, col, col2)


@njit(**OPTS)
def quantize_row_split(x, m, out, sums, scales, r):
    """out[r] [2, G, H] = row m of x [M, K] fp32 as int16 in the int4 kernels' even / odd order
    (out[r, 0, g, j] ≈ x[m, g·2H + 2j] / xs, out[r, 1, g, j] ≈ x[m, g·2H + 2j + 1] / xs), each
    group with its own scale scales[r, g] = absmax(group) / 32767 (a group's int32 sum cannot
    overflow: |q| ≤ 15, ≤ 128 products); sums[r, g] = Σ of group g's int16 values."""
    G, H = out.shape[2], out.shape[3]
    for g in range(G):
        top = F32(0.0)
        for j in range(2 * H):
            top = max(top, abs(x[m, g * 2 * H + j]))
        inv = QMAX / top if top > 0 else F32(0.0)
        total = I32(0)
        for j in range(H):
            k = g * 2 * H + 2 * j
            e, o = _q16(x[m, k], inv), _q16(x[m, k + 1], inv)
            out[r, 0, g, j], out[r, 1, g, j] = e, o
            total = I32(total + I32(e) + I32(o))
        sums[r, g] = total
        scales[r, g] = top / QMAX


@njit(**OPTS)
def quantize_split_row(xf, m, out, sums, scales):
    """`quantize_row_split` for a row already split: xf [M, 2, G, H] fp32 → out[m], sums[m], scales[m]."""
    G, H = xf.shape[2], xf.shape[3]
    for g in range(G):
        top = F32(0.0)
        for h in range(2):
            for j in range(H):
                top = max(top, abs(xf[m, h, g, j]))
        inv = QMAX / top if top > 0 else F32(0.0)
        total = I32(0)
        for h in range(2):
            for j in range(H):
                q = _q16(xf[m, h, g, j], inv)
                out[m, h, g, j] = q
                total = I32(total + I32(q))
        sums[m, g] = total
        scales[m, g] = top / QMAX


@njit(**OPTS)
def q4_col(xq, sums, xs, m0, m1, w, n, s, y, col):
    """y[m, col] = Σ_k x[m, k]·W[n, k] for the x rows m in [m0, m1) and one int4 weight row n: 4 × 1
    tiles, then 2 × 1, then 1 × 1 (each weight vector unpacked once per tile, not once per x row)."""
    m = m0
    while m + 4 <= m1:
        t = q4_tile_4x1(xq, sums, xs, m, w, n, n, s)
        y[m, col], y[m + 1, col], y[m + 2, col], y[m + 3, col] = t[0], t[1], t[2], t[3]
        m += 4
    if m + 2 <= m1:
        t = q4_tile_2x1(xq, sums, xs, m, w, n, n, s)
        y[m, col], y[m + 1, col] = t[0], t[1]
        m += 2
    if m < m1:
        y[m, col] = q4_tile_1x1(xq, sums, xs, m, w, n, n, s)[0]


@njit(**OPTS)
def q4_cols(xq, sums, xs, m, w, n0, n1, s, y, ym):
    """y[ym, n] = Σ_k x[m, k]·W[n, k] for n in [n0, n1): one weight row at a time (the
    1 × 1 tile, one stream; at one x row it beats pairs of rows, docs/cpu.md)."""
    for n in range(n0, n1):
        y[ym, n] = q4_tile_1x1(xq, sums, xs, m, w, n, n, s)[0]


@njit(**OPTS)
def quantize_single_rows(x, offsets, active, xq, xs):
    """xq[m], xs[m] for the row m of each active expert that has exactly one row (others untouched)."""
    for e in active:
        if offsets[e + 1] - offsets[e] == 1:
            quantize_row(x, offsets[e], xq, xs, offsets[e])
