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
from numba import njit

from moetune.kernels.cpu._opts import OPTS

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
    """Σ_k xq[r, k]·w[n, k] exactly, in int32 (xq int16 [·, K], w int8 [N, K])."""
    acc = I32(0)
    for k in range(w.shape[1]):
        acc = I32(acc + I32(xq[r, k]) * I32(w[n, k]))
    return acc


@njit(**OPTS)
def quantize_single_rows(x, offsets, active, xq, xs):
    """xq[m], xs[m] for the row m of each active expert that has exactly one row (others untouched)."""
    for e in active:
        if offsets[e + 1] - offsets[e] == 1:
            xs[offsets[e]] = quantize_row(x, offsets[e], xq, offsets[e])
