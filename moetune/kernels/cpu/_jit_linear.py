"""Small-M linear: x [M, K] @ W [N, K].T over blocks of weight rows (numba; imported by `_jit`).

fp32 / int8 rows through the fp32 tiles of `_jit_tiles` (`linear_dense`; at one x row GEMV_ROWS weight
rows per pass, `gemv_rows`), int8 rows in integers
(`linear_q8`: x quantised once per call to int16 per block, `_jit_q8`), int4 rows in integers
(`linear_q4`) or through the fp32 nibble split (`linear_int4`). Each parallel driver has a serial
twin over the same work items (`runtime.launch` hands them out for small calls).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._jit_q8 import dot1_q, q4_col, q4_cols, q8_rows, quantize_row_split, quantize_rows, x_blocks
from moetune.kernels.cpu._jit_tiles import AHEAD, I0, M_CHUNK, SHORT_ROW, GEMV_ROWS, dense_rows, gemv_rows, int4_tile
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._prefetch import prefetch_row


@njit(**OPTS)
def _linear_block(x, w, scale, y, block, b):
    """Rows [b·block, (b+1)·block) of W against every row of x (one work item of `linear_dense`)."""
    M, N = x.shape[0], w.shape[0]
    ahead = M > 1 or w.shape[1] * w.itemsize <= SHORT_ROW
    n1 = min(N, (b + 1) * block)
    if M == 1:  # a GEMV: GEMV_ROWS weight rows per pass (`gemv_rows`: as many read streams, docs/cpu.md)
        for n in range(b * block, n1, GEMV_ROWS):
            if ahead and n + AHEAD + GEMV_ROWS - 1 < N:
                for i in range(GEMV_ROWS):
                    prefetch_row(w, n + AHEAD + i)
            gemv_rows(x, I0, w, n, min(n1, n + GEMV_ROWS), scale, y, I0)
        return
    for mc in range(0, M, M_CHUNK):
        for n in range(b * block, n1, 2):
            n2 = min(n + 1, n1 - 1)
            if ahead and mc == 0 and n + AHEAD + 1 < N:
                prefetch_row(w, n + AHEAD)
                prefetch_row(w, n + AHEAD + 1)
            dense_rows(x, mc, min(M, mc + M_CHUNK), w, n, n2, scale[n], scale[n2], y, mc, n, n2)


@njit(parallel=True, **OPTS)
def linear_dense(x, w, scale, y, block):
    """x [M, K] fp32, w [N, K] fp32|int8, scale [N] fp32 → y [M, N]; prange over blocks of N."""
    for b in prange((w.shape[0] + block - 1) // block):
        _linear_block(x, w, scale, y, block, np.int64(b))  # the serial twin's signature (`_jit_tiles.I0`)


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
        _q8_block(xq, xs, w, scale, y, block, np.int64(b))


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
    for n in range(b * block, n1):  # one weight row at a time, unpacked once per 4 x rows (`q4_col`)
        q4_col(xq, sums, xs, 0, xq.shape[0], w, n, scale, y, n)


@njit(parallel=True, **OPTS)
def linear_q4(x, w, scale, y, block):
    """x [M, K] fp32, w [N, G, H] uint8 int4, scale [N, G] → y [M, N]: x rounded to int16 per row,
    each group's nibbles against it in integers, one fp32 scale per group (`_simd.q4_row`)."""
    q = _q4_input(x, w)
    for b in prange((w.shape[0] + block - 1) // block):
        _q4_block(q, w, scale, y, block, np.int64(b))


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
            int4_tile(xq, xs, mc, min(M, mc + M_CHUNK), w, n, n2, scale, deq, y, mc, n, n2)


@njit(parallel=True, **OPTS)
def linear_int4(xq, xs, w, scale, y, block):
    """xq [M, 2, G, group/2], xs [M, G] (see `int4_rows`); w [N, G, group/2] u8, scale [N, G]."""
    for b in prange((w.shape[0] + block - 1) // block):
        _linear_int4_block(xq, xs, w, scale, y, block, np.int64(b))


@njit(**OPTS)
def linear_int4_serial(xq, xs, w, scale, y, block):
    for b in range((w.shape[0] + block - 1) // block):
        _linear_int4_block(xq, xs, w, scale, y, block, b)
