"""The integer primitives of int8 weight rows against one x row (numba; imported by `_jit`).

With one x row there is nothing to reuse a widened weight element for, so the fp32 path of `_jit`
(each int8 byte widened to fp32, then an FMA) runs at the rate of its conversions, below the read
limit. Here the row is quantised once per call to int16 with its own scale, and each weight row
is one integer dot product: `int16 · int8 → int32` pairs summed, which LLVM compiles to
`vpmaddwd` (AVX2 and AVX-512; VNNI's `vpdpwssd` where present), 32 (AVX-512) or 16 (AVX2)
multiply-adds per instruction and no conversion per weight.

Numerics (`x_qmax`): x[k] ≈ xq[k]·xs with xs = absmax(x) / qmax, |x[k] − xq[k]·xs| ≤ xs / 2, and
qmax = min(32767, ⌊(2³¹ − 1) / (127·K)⌋), so that no int32 sum of K products can overflow whatever
the inputs: 15 bits of x for K ≤ 516, 14.4 at K = 768, 12 at K = 4096. The integer sum is exact;
y[n] = float(Σ_k xq[k]·w[n, k]) · scale[n] · xs. So y differs from the fp32 path by at most
(xs / 2)·Σ_k |w[n, k]|·scale[n] (plus fp32 rounding), which the twin tests check.

Used by `_jit`: `linear_q8` (a projection at M = 1) and the experts' one-row passes (`_up_cols`,
`_down_cols`: each row quantised once per call, before the pass that reads it). Every inner loop index runs from 0 and the sums are written `np.int32(acc + ...)`: numba types an
int32 sum as int64 otherwise, which LLVM then vectorises as 64-bit multiplies (2.2x slower).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._simd import q4_tile_1x1, q4_tile_1x2, q8_tile_1x2, q8_tile_2x2, q8_tile_4x2

I32, F32 = np.int32, np.float32
INT32_MAX = 2147483647


@njit(**OPTS)
def x_qmax(K):
    """The largest |xq| for rows of K columns against int8 weights (|w| ≤ 127) such that an int32
    sum of K products cannot overflow."""
    return min(32767, INT32_MAX // (127 * max(K, 1)))


@njit(**OPTS)
def quantize_row(x, m, out, r):
    """out[r] = row m of x [M, K] fp32 as int16 (round to nearest, |q| ≤ x_qmax(K)); returns its scale."""
    K = x.shape[1]
    top = F32(0.0)
    for k in range(K):
        top = max(top, abs(x[m, k]))
    qmax = F32(x_qmax(K))
    inv = qmax / top if top > 0 else F32(0.0)
    for k in range(K):
        out[r, k] = np.int16(min(max(np.rint(x[m, k] * inv), -qmax), qmax))
    return top / qmax


@njit(**OPTS)
def dot_q(xq, r, w, n):
    """Σ_k xq[r, k]·w[n, k] exactly, in int32 (xq int16 [·, K], w int8 [N, K]). A numba loop, not
    `_simd`'s 1 × 1 tile: at one row the loop ran at the read limit and the tile 0.78-0.98x of it
    (kernel A/B, docs/cpu.md)."""
    acc = I32(0)
    for k in range(w.shape[1]):
        acc = I32(acc + I32(xq[r, k]) * I32(w[n, k]))
    return acc


@njit(**OPTS)
def quantize_rows(x, xq, xs):
    """xq [M, K] int16, xs [M]: every row of x [M, K] as `quantize_row` rounds it."""
    for m in range(x.shape[0]):
        xs[m] = quantize_row(x, m, xq, m)


def q8_rows(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
    """y[m, col] = s·xs[m]·Σ_k xq[m, k]·w[n, k] (and n2 → col2 with s2) for m in [m0, m1): for int8 w
    `q8_tiles`; other dtypes type as plain loops (branches compiled for fp32 weights, never taken)."""
    raise NotImplementedError("q8_rows runs inside numba kernels only")


@overload(q8_rows, jit_options={"fastmath": True})
def _q8_rows(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
    if w.dtype == types.int8 and w.layout == "C":
        return lambda xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2: q8_tiles(xq, xs, m0, m1, w, n, n2, s, s2, y,
                                                                              col, col2)

    def loop(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
        for m in range(m0, m1):
            y[m, col] = F32(dot_q(xq, m, w, n)) * (s * xs[m])
            y[m, col2] = F32(dot_q(xq, m, w, n2)) * (s2 * xs[m])
    return loop


@njit(**OPTS)
def _put(t, rows, m, xs, s, s2, y, col, col2):
    """y[m + i, col], y[m + i, col2] = tile sums t (row-major, 2 per x row) times their scales."""
    for i in range(rows):
        y[m + i, col] = F32(t[2 * i]) * (s * xs[m + i])
        y[m + i, col2] = F32(t[2 * i + 1]) * (s2 * xs[m + i])


@njit(**OPTS)
def q8_tiles(xq, xs, m0, m1, w, n, n2, s, s2, y, col, col2):
    """`q8_rows` for int8 w: 4 × 2 integer tiles, then 2 × 2, then 1 × 2 (odd tails pass n2 = n:
    computed twice, written once)."""
    m = m0
    while m + 4 <= m1:
        _put(q8_tile_4x2(xq, m, w, n, n2), 4, m, xs, s, s2, y, col, col2)
        m += 4
    if m + 2 <= m1:
        _put(q8_tile_2x2(xq, m, w, n, n2), 2, m, xs, s, s2, y, col, col2)
        m += 2
    if m < m1:
        _put(q8_tile_1x2(xq, m, w, n, n2), 1, m, xs, s, s2, y, col, col2)


@njit(**OPTS)
def _absmax(x, m):
    top = F32(0.0)
    for k in range(x.shape[1]):
        top = max(top, abs(x[m, k]))
    return top


@njit(**OPTS)
def _q16(v, inv):
    """v·inv rounded to int16 (|v·inv| ≤ 32767 by the caller's choice of inv)."""
    return np.int16(min(max(np.rint(v * inv), F32(-32767.0)), F32(32767.0)))


@njit(**OPTS)
def quantize_row_split(x, m, out, sums, r):
    """out[r] [2, G, H] = row m of x [M, K] fp32 as int16 in the int4 kernels' even / odd order
    (out[r, 0, g, j] ≈ x[m, g·2H + 2j] / xs, out[r, 1, g, j] ≈ x[m, g·2H + 2j + 1] / xs), qmax 32767
    (a group's int32 sum cannot overflow: |q| ≤ 15, ≤ 128 products); sums[r, g] = Σ of group g's
    int16 values; returns xs = absmax / 32767."""
    G, H = out.shape[2], out.shape[3]
    top = _absmax(x, m)
    inv = F32(32767.0) / top if top > 0 else F32(0.0)
    for g in range(G):
        total = I32(0)
        for j in range(H):
            k = g * 2 * H + 2 * j
            e, o = _q16(x[m, k], inv), _q16(x[m, k + 1], inv)
            out[r, 0, g, j], out[r, 1, g, j] = e, o
            total = I32(total + I32(e) + I32(o))
        sums[r, g] = total
    return top / F32(32767.0)


@njit(**OPTS)
def quantize_split_row(xf, m, out, sums, scales):
    """`quantize_row_split` for a row already split: xf [M, 2, G, H] fp32 → out[m], sums[m], scales[m]."""
    G, H = xf.shape[2], xf.shape[3]
    top = F32(0.0)
    for h in range(2):
        for g in range(G):
            for j in range(H):
                top = max(top, abs(xf[m, h, g, j]))
    inv = F32(32767.0) / top if top > 0 else F32(0.0)
    for g in range(G):
        total = I32(0)
        for h in range(2):
            for j in range(H):
                q = _q16(xf[m, h, g, j], inv)
                out[m, h, g, j] = q
                total = I32(total + I32(q))
        sums[m, g] = total
    scales[m] = top / F32(32767.0)


@njit(**OPTS)
def q4_rows(xq, sums, xs, m, w, n, n2, s, y, ym, col, col2):
    """y[ym, col] = Σ_k x[m, k]·W[n, k] (and n2 → col2) for int4 W (w uint8 [N, G, H], s [N, G]),
    x row m as `quantize_row_split` rounds it (xq, sums, xs)."""
    if n2 == n:
        y[ym, col] = q4_tile_1x1(xq, sums, m, w, n, n, s)[0] * xs[m]
        return
    t = q4_tile_1x2(xq, sums, m, w, n, n2, s)
    y[ym, col], y[ym, col2] = t[0] * xs[m], t[1] * xs[m]


@njit(**OPTS)
def quantize_single_rows(x, offsets, active, xq, xs):
    """xq[m], xs[m] for the row m of each active expert that has exactly one row (others untouched)."""
    for e in active:
        if offsets[e + 1] - offsets[e] == 1:
            xs[offsets[e]] = quantize_row(x, offsets[e], xq, offsets[e])
