"""Grouped experts with int4 weights (numba; imported by `_jit`): the int4 twin of
`_jit_experts.experts_dense`, experts of few rows in integers (`_jit_q8`), others through the fp32
nibble split of `_jit_tiles`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._jit_experts import silu
from moetune.kernels.cpu._jit_q8 import q4_col, q4_cols, quantize_split_row
from moetune.kernels.cpu._jit_tiles import F0, M_CHUNK, int4_tile
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._simd import q4_tile_1x2, q4_tile_2x2

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
        for j in range(j0, j1):  # gate and up row of a column, two x rows at a time (2 × 2 tiles)
            h, c, i = j % 2, (j // 2) // Hi, (j // 2) % Hi
            m = offsets[e]
            while m + 2 <= offsets[e + 1]:
                t = q4_tile_2x2(xq16, xsum, xsc, m, we, j, I + j, se)
                aq[m, h, c, i], aq[m + 1, h, c, i] = silu(t[0]) * t[1], silu(t[2]) * t[3]
                m += 2
            if m < offsets[e + 1]:
                t = q4_tile_1x2(xq16, xsum, xsc, m, we, j, I + j, se)
                aq[m, h, c, i] = silu(t[0]) * t[1]
        return
    gu = np.empty((M_CHUNK, 2), np.float32)
    deq = np.empty((2, 2, we.shape[1], we.shape[2]), np.float32)
    for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
        m1 = min(offsets[e + 1], mc + M_CHUNK)
        for j in range(j0, j1):
            int4_tile(xq, xs, mc, m1, we, j, I + j, se, deq, gu, 0, 0, 1)
            for i in range(m1 - mc):
                aq[mc + i, j % 2, (j // 2) // Hi, (j // 2) % Hi] = silu(gu[i, 0]) * gu[i, 1]


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
        for n in range(n0, n1):  # one weight row at a time, unpacked once per 4 x rows
            q4_col(q[3], q[4], q[5], offsets[e], offsets[e + 1], we, n, se, y, n)
        return
    deq = np.empty((2, 2, we.shape[1], we.shape[2]), np.float32)
    for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
        m1 = min(offsets[e + 1], mc + M_CHUNK)
        for n in range(n0, n1, 2):
            n2 = min(n + 1, n1 - 1)
            int4_tile(aq, asum, mc, m1, we, n, n2, se, deq, y, mc, n, n2)


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
def experts_int4_serial(xq, xs, offsets, active, w13, s13, w2, s2, aq, asum, y, block13, block2, rows=0):
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
