"""Grouped experts over sorted rows, fp32 or int8 weights: w13 → SiLU(gate)·up → w2 (numba;
imported by `_jit`). Two schedules: whole experts per thread (`_experts_lanes`, no barrier between
the passes) or (expert, block of columns) items (`_experts_split`); `experts_dense` picks one.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._jit_q8 import dot1_q, dot2_q, quantize_row, quantize_single_rows, x_blocks
from moetune.kernels.cpu._jit_tiles import (AHEAD, GEMV_ROWS, I0, I1, M_CHUNK, SHORT_ROW, dense_rows, dot_row, dot_rows4, dot_rows8,
                                            gemv_rows)
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._prefetch import prefetch_row


@njit(**OPTS)
def silu(g):
    return g / (np.float32(1.0) + np.exp(-g))


@njit(**OPTS)
def up_pairs1(x, m, we, s13, e, a, j0, j1, ahead):
    I = we.shape[0] // 2
    for j in range(j0, j1):
        if ahead and j + AHEAD < I:
            prefetch_row(we, j + AHEAD)
            prefetch_row(we, I + j + AHEAD)
        a[m, j] = silu(dot_row(x, m, we, j) * s13[e, j]) * (dot_row(x, m, we, I + j) * s13[e, I + j])


@njit(**OPTS)
def up_pairs4(x, m, we, s13, e, a, j0, j1, ahead):
    I = we.shape[0] // 2
    last = j1 - 1
    for j in range(j0, j1, 2):
        c = (j, min(j + 1, last))
        if ahead and j + AHEAD + 1 < I:
            for i in range(2):
                prefetch_row(we, j + AHEAD + i)
                prefetch_row(we, I + j + AHEAD + i)
        g = dot_rows4(x, m, we, c[0], c[1], I + c[0], I + c[1])
        for i in range(2):
            a[m, c[i]] = silu(g[i] * s13[e, c[i]]) * (g[2 + i] * s13[e, I + c[i]])


@njit(**OPTS)
def up_pairs8(x, m, we, s13, e, a, j0, j1, ahead):
    I = we.shape[0] // 2
    last = j1 - 1
    for j in range(j0, j1, 4):
        c = (j, min(j + 1, last), min(j + 2, last), min(j + 3, last))
        if ahead and j + AHEAD + 3 < I:
            for i in range(4):
                prefetch_row(we, j + AHEAD + i)
                prefetch_row(we, I + j + AHEAD + i)
        g = dot_rows8(x, m, we, c[0], c[1], c[2], c[3], I + c[0], I + c[1], I + c[2], I + c[3])
        for i in range(4):
            a[m, c[i]] = silu(g[i] * s13[e, c[i]]) * (g[4 + i] * s13[e, I + c[i]])


# up_pairs(x, m, we, s13, e, a, j0, j1, ahead): a[m, j] = silu(s13[e, j]·x[m]·we[j]) · s13[e, I+j]·x[m]·we[I+j]
# for j in [j0, j1), one x row, we = w13[e] [2I, D]: as `gemv_rows` reads (`GEMV_ROWS`): gate row j then up
# row I+j (1), or the gate and up rows of GEMV_ROWS / 2 columns in one pass (`dot_rows4` / `dot_rows8`)
up_pairs = {1: up_pairs1, 4: up_pairs4, 8: up_pairs8}[GEMV_ROWS]


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
        if not q8:  # fp32 (or int8 widened): gate and up together, GEMV_ROWS read streams
            up_pairs(x, m0, we, s13, e, a, j0, j1, ahead)
            return
        for j in range(j0, j1):
            if ahead and j + AHEAD < I:
                prefetch_row(we, j + AHEAD)
                prefetch_row(we, I + j + AHEAD)
            t = dot2_q(xq, xs, m0, we, j, I + j)
            a[m0, j] = silu(t[0] * s13[e, j]) * (t[1] * s13[e, I + j])
        return
    we, se = w13[e], s13[e]  # one view per call
    ahead = we.shape[1] * we.itemsize <= SHORT_ROW
    for mc in range(m0, m1, M_CHUNK):
        me = min(m1, mc + M_CHUNK)
        for j in range(j0, j1):
            if ahead and mc == m0 and j + AHEAD < I:
                prefetch_row(we, j + AHEAD)
                prefetch_row(we, I + j + AHEAD)
            dense_rows(x, mc, me, we, j, I + j, se[j], se[I + j], gu, I0, I0, I1)
            for i in range(me - mc):
                a[mc + i, j] = silu(gu[i, 0]) * gu[i, 1]


@njit(**OPTS)
def _down_cols(a, offsets, e, w2, s2, y, n0, n1, aq, as_):
    """y[m, n] = s2[e, n]·a[m]·w2[e, n] for the rows m of expert e and the columns n in [n0, n1)
    (aq, as_: a's rows in int16 where the integer path is on, as for `_up_cols`)."""
    m0, m1 = offsets[e], offsets[e + 1]
    if m1 - m0 == 1:
        we = w2[e]
        ahead = we.itemsize == 1
        q8 = aq.shape[0] > 0 and we.itemsize == 1
        if not q8:  # fp32 (or int8 widened): GEMV_ROWS weight rows per pass (`gemv_rows`)
            se = s2[e]  # one view per call
            for n in range(n0, n1, GEMV_ROWS):
                if ahead and n + AHEAD + GEMV_ROWS - 1 < we.shape[0]:
                    for i in range(GEMV_ROWS):
                        prefetch_row(we, n + AHEAD + i)
                gemv_rows(a, m0, we, n, min(n1, n + GEMV_ROWS), se, y, m0)
            return
        for n in range(n0, n1):
            if ahead and n + AHEAD < we.shape[0]:
                prefetch_row(we, n + AHEAD)
            y[m0, n] = dot1_q(aq, as_, m0, we, n) * s2[e, n]  # one weight row at a time, as `_q8_block` at one x row
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
            dense_rows(a, mc, me, we, n, n2, se[n], se[n2], y, mc, n, n2)


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
