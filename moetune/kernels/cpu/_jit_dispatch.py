"""The fused decode layer's kernels by weight kind (numba `overload`s; imported by `_jit_layer`).

A record's weights are fp32, int8 (a scale per row) or int4 (uint8 nibbles, a scale per group, one
more axis): numba types each record by its arrays, so the kind is known when a layer's call is
compiled and each overload returns the one body that kind runs, the same kernels `linear.linear` and
`experts.fused_experts_cpu` call for it, under the same rules:

  matmul_into(x, w, scale, y, parallel, q8, q4, q4x)   y [T, N] = x [T, K] @ W.T
      int8 rows, T ≤ q8: `linear_q8` (integers); int4 interleaved (scales [S·N/16, G, 16], `q4r`):
      `linear_q4r` (x in q4x int8 parts, any T); int4, T ≤ q4: `linear_q4` (integers), else
      `linear_int4` on x split into even / odd columns (`split_int4`); fp32 (and int8 past q8):
      `linear_dense`. parallel: the parallel kernel, else its serial twin.
  experts_into(x, offsets, active, experts, tuning, lanes, y)   y [N, D] = every active expert's
      w13 → SiLU·mul → w2 over its rows: `experts_dense` (fp32 / int8), `experts_q4r` (int4
      interleaved: scales of 4 axes), `experts_int4` (int4:
      experts of ≤ q4 rows in integers), on `lanes` threads (1: the serial twin).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from moetune.kernels.cpu._jit_experts import experts_dense
from moetune.kernels.cpu._jit_experts_int4 import experts_int4, experts_int4_serial
from moetune.kernels.cpu._jit_linear import (linear_dense, linear_dense_serial, linear_int4, linear_int4_serial,
                                             linear_q4, linear_q4_serial, linear_q8, linear_q8_serial)
from moetune.kernels.cpu._jit_q4r import experts_q4r, experts_q4r_serial, linear_q4r, linear_q4r_serial
from moetune.kernels.cpu._jit_tiles import F0
from moetune.kernels.cpu._opts import OPTS

BLOCK_N = np.int64(8)  # weight rows per work item of a projection (linear.BLOCK_N), typed int64 as the
# wrappers pass it from Python (a literal 8 would compile each linear kernel once more: `_jit_tiles.I0`)


@njit(**OPTS)
def split_int4(x, G, H):
    """x [M, G·2H] → (xq [M, 2, G, H]: even columns, then odd; xs [M, G] each group's sum), as
    `linear.split_int4_input` makes them for the fp32 int4 kernels."""
    M = x.shape[0]
    xq = np.empty((M, 2, G, H), np.float32)
    xs = np.empty((M, G), np.float32)
    for m in range(M):
        for g in range(G):
            acc = F0
            for j in range(H):
                e, o = x[m, g * 2 * H + 2 * j], x[m, g * 2 * H + 2 * j + 1]
                xq[m, 0, g, j] = e
                xq[m, 1, g, j] = o
                acc += e + o
            xs[m, g] = acc
    return xq, xs


def matmul_into(x, w, scale, y, parallel, q8, q4, q4x):
    """y = x @ W.T (with W's scales) by W's kind (see the module docstring)."""
    raise NotImplementedError("matmul_into runs inside numba kernels only")


@overload(matmul_into, jit_options={"fastmath": True})
def _matmul_into(x, w, scale, y, parallel, q8, q4, q4x):
    if w.ndim == 3 and scale.ndim == 3:  # int4 interleaved (`q4r`): [N, G, H], scales [S·N/16, G, 16]
        def int4r(x, w, scale, y, parallel, q8, q4, q4x):
            if parallel:
                linear_q4r(x, w, scale, y, q4x[0], q4x[1])
            else:
                linear_q4r_serial(x, w, scale, y, q4x[0], q4x[1])
        return int4r
    if w.ndim == 3:  # int4 [N, G, group/2]
        def int4(x, w, scale, y, parallel, q8, q4, q4x):
            if x.shape[0] <= q4:
                if parallel:
                    linear_q4(x, w, scale, y, BLOCK_N)
                else:
                    linear_q4_serial(x, w, scale, y, BLOCK_N)
                return
            xq, xs = split_int4(x, w.shape[1], w.shape[2])
            if parallel:
                linear_int4(xq, xs, w, scale, y, BLOCK_N)
            else:
                linear_int4_serial(xq, xs, w, scale, y, BLOCK_N)
        return int4

    if w.dtype == types.int8:  # int8 rows: the integer path up to q8 x rows, else widened to fp32
        def int8(x, w, scale, y, parallel, q8, q4, q4x):
            if x.shape[0] <= q8:
                if parallel:
                    linear_q8(x, w, scale, y, BLOCK_N)
                else:
                    linear_q8_serial(x, w, scale, y, BLOCK_N)
            elif parallel:
                linear_dense(x, w, scale, y, BLOCK_N)
            else:
                linear_dense_serial(x, w, scale, y, BLOCK_N)
        return int8

    def dense(x, w, scale, y, parallel, q8, q4, q4x):  # fp32 (typed apart: no int8 kernel compiled for fp32 rows)
        if parallel:
            linear_dense(x, w, scale, y, BLOCK_N)
        else:
            linear_dense_serial(x, w, scale, y, BLOCK_N)
    return dense


def experts_into(x, offsets, active, experts, tuning, lanes, y):
    """y += every active expert's output over its rows, by the experts' kind (see the module docstring)."""
    raise NotImplementedError("experts_into runs inside numba kernels only")


@overload(experts_into, jit_options={"fastmath": True})
def _experts_into(x, offsets, active, experts, tuning, lanes, y):
    if experts[0].ndim == 4 and experts[1].ndim == 4:  # int4 interleaved (`q4r`), scales [P, S·2I/16, Gd, 16]
        def int4r(x, offsets, active, experts, tuning, lanes, y):
            w13, s13, w2, s2 = experts[0], experts[1], experts[2], experts[3]  # Experts
            a = np.empty((x.shape[0], w2.shape[2] * 2 * w2.shape[3]), np.float32)  # [N, I] activation
            if lanes > 1:
                experts_q4r(x, offsets, active, w13, s13, w2, s2, a, y, tuning[7], tuning[8], lanes)
            else:
                experts_q4r_serial(x, offsets, active, w13, s13, w2, s2, a, y, tuning[7], tuning[8], lanes)
        return int4r
    if experts[0].ndim == 4:  # int4 w13 [P, 2I, Gd, Hd]
        def int4(x, offsets, active, experts, tuning, lanes, y):
            w13, s13, w2, s2 = experts[0], experts[1], experts[2], experts[3]  # Experts
            block13, block2, q4 = tuning[2], tuning[3], tuning[6]  # Tuning
            xq, xs = split_int4(x, w13.shape[2], w13.shape[3])  # [N, 2, Gd, Hd], [N, Gd]
            N, Gi, Hi = x.shape[0], w2.shape[2], w2.shape[3]
            aq, asum = np.empty((N, 2, Gi, Hi), np.float32), np.empty((N, Gi), np.float32)
            if lanes > 1:
                experts_int4(xq, xs, offsets, active, w13, s13, w2, s2, aq, asum, y, block13, block2, q4)
            else:
                experts_int4_serial(xq, xs, offsets, active, w13, s13, w2, s2, aq, asum, y, block13, block2, q4)
        return int4

    def dense(x, offsets, active, experts, tuning, lanes, y):
        w13, s13, w2, s2 = experts[0], experts[1], experts[2], experts[3]  # Experts
        block13, block2, schedule, q8 = tuning[2], tuning[3], tuning[4], tuning[5]  # Tuning
        a = np.empty((x.shape[0], w2.shape[2]), np.float32)  # [N, I] activation scratch
        experts_dense(x, offsets, active, w13, s13, w2, s2, a, y, block13, block2, schedule, lanes, q8)
    return dense
