"""The numba kernels (imported lazily by `runtime.jit()`, never at package import).

All math is fp32 with fastmath (the k reductions are reassociated into SIMD lanes). Arrays are
numpy views of C-contiguous torch tensors; the wrappers in `linear.py` / `experts.py` check them.

Tile order inside one work item: rows of x in chunks of `M_CHUNK`, then weight rows, then x rows
four at a time against one weight row (each weight element is loaded once per four x rows; the
weight block stays in L1/L2 while the next x chunk reuses it).

Dense rows (fp32 or int8) share one code path: `w[n, k]` widened to fp32, the row's scale applied
once after the reduction (ones for fp32). Int4 rows take x split into even / odd columns and the
per-group sums of x, so that `sum x·(q - 8) = sum x·q - 8·sum x` and the loop over the bytes of a
group is two plain vector FMAs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_OPTS = dict(cache=True, fastmath=True, nogil=True, error_model="numpy")
M_CHUNK = 16


# --- one weight row against x rows [m0, m1) ------------------------------------------------------

@njit(**_OPTS)
def _dense_row(x, m0, m1, wr, s, y, col):
    """y[m, col] = s · Σ_k x[m, k]·wr[k] for m in [m0, m1); wr is fp32 or int8 [K]."""
    K = wr.shape[0]
    m = m0
    while m + 4 <= m1:
        x0, x1, x2, x3 = x[m], x[m + 1], x[m + 2], x[m + 3]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for k in range(K):
            wk = np.float32(wr[k])
            a0 += x0[k] * wk
            a1 += x1[k] * wk
            a2 += x2[k] * wk
            a3 += x3[k] * wk
        y[m, col], y[m + 1, col], y[m + 2, col], y[m + 3, col] = a0 * s, a1 * s, a2 * s, a3 * s
        m += 4
    while m < m1:
        x0 = x[m]
        a0 = np.float32(0.0)
        for k in range(K):
            a0 += x0[k] * np.float32(wr[k])
        y[m, col] = a0 * s
        m += 1


@njit(**_OPTS)
def _int4_group(xe, xo, wq, j0, j1):
    a = np.float32(0.0)
    for j in range(j0, j1):
        b = wq[j]
        a += xe[j] * np.float32(b & 15) + xo[j] * np.float32(b >> 4)
    return a


@njit(**_OPTS)
def _int4_row(xe, xo, xs, m0, m1, wq, ws, half, y, col):
    """y[m, col] = Σ_g ws[g] · Σ_{k in g} x[m, k]·(q[k] - 8); wq [K/2] packed, `half` = group/2 bytes."""
    G = ws.shape[0]
    m = m0
    while m + 4 <= m1:
        t0 = t1 = t2 = t3 = np.float32(0.0)
        for g in range(G):
            j0 = g * half
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for j in range(j0, j0 + half):
                b = wq[j]
                lo, hi = np.float32(b & 15), np.float32(b >> 4)
                a0 += xe[m, j] * lo + xo[m, j] * hi
                a1 += xe[m + 1, j] * lo + xo[m + 1, j] * hi
                a2 += xe[m + 2, j] * lo + xo[m + 2, j] * hi
                a3 += xe[m + 3, j] * lo + xo[m + 3, j] * hi
            s = ws[g]
            t0 += s * (a0 - 8.0 * xs[m, g])
            t1 += s * (a1 - 8.0 * xs[m + 1, g])
            t2 += s * (a2 - 8.0 * xs[m + 2, g])
            t3 += s * (a3 - 8.0 * xs[m + 3, g])
        y[m, col], y[m + 1, col], y[m + 2, col], y[m + 3, col] = t0, t1, t2, t3
        m += 4
    while m < m1:
        t0 = np.float32(0.0)
        for g in range(G):
            a0 = _int4_group(xe[m], xo[m], wq, g * half, g * half + half)
            t0 += ws[g] * (a0 - 8.0 * xs[m, g])
        y[m, col] = t0
        m += 1


# --- small-M linear ------------------------------------------------------------------------------

@njit(parallel=True, **_OPTS)
def linear_dense(x, w, scale, y, block):
    """x [M, K] fp32, w [N, K] fp32|int8, scale [N] fp32 → y [M, N]; prange over blocks of N."""
    M, N = x.shape[0], w.shape[0]
    for b in prange((N + block - 1) // block):
        n1 = min(N, (b + 1) * block)
        for mc in range(0, M, M_CHUNK):
            for n in range(b * block, n1):
                _dense_row(x, mc, min(M, mc + M_CHUNK), w[n], scale[n], y, n)


@njit(parallel=True, **_OPTS)
def linear_int4(xe, xo, xs, w, scale, y, block):
    """xe/xo [M, K/2] even/odd columns of x, xs [M, G] group sums; w [N, K/2] u8, scale [N, G]."""
    M, N = xe.shape[0], w.shape[0]
    half = w.shape[1] // scale.shape[1]
    for b in prange((N + block - 1) // block):
        n1 = min(N, (b + 1) * block)
        for mc in range(0, M, M_CHUNK):
            for n in range(b * block, n1):
                _int4_row(xe, xo, xs, mc, min(M, mc + M_CHUNK), w[n], scale[n], half, y, n)


# --- grouped experts: w13 → SiLU(gate)·up → w2 ---------------------------------------------------

@njit(**_OPTS)
def _silu_mul(g, u, a, m0, m1, col):
    """a[m, col] = silu(g[m, 0]) · u[m, 0] for m in [m0, m1) (g, u: per-row scratch [M_CHUNK, 1])."""
    for m in range(m0, m1):
        gv, uv = g[m - m0, 0], u[m - m0, 0]
        a[m, col] = gv / (np.float32(1.0) + np.exp(-gv)) * uv


@njit(parallel=True, **_OPTS)
def experts_dense(x, offsets, active, w13, s13, w2, s2, a, y, block13, block2):
    """x [N, D]; offsets [E+1]; active [A] non-empty experts; w13 [E, 2I, D], s13 [E, 2I];
    w2 [E, D, I], s2 [E, D]; a [N, I] scratch; y [N, D]. Work items: (active expert, block)."""
    I, D = w2.shape[2], w2.shape[1]
    nb13 = (I + block13 - 1) // block13
    for t in prange(active.shape[0] * nb13):
        e, b = active[t // nb13], t % nb13
        g = np.empty((M_CHUNK, 1), np.float32)
        u = np.empty((M_CHUNK, 1), np.float32)
        for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
            m1 = min(offsets[e + 1], mc + M_CHUNK)
            for j in range(b * block13, min(I, (b + 1) * block13)):
                _dense_row(x[mc:m1], 0, m1 - mc, w13[e, j], s13[e, j], g, 0)
                _dense_row(x[mc:m1], 0, m1 - mc, w13[e, I + j], s13[e, I + j], u, 0)
                _silu_mul(g, u, a, mc, m1, j)
    nb2 = (D + block2 - 1) // block2
    for t in prange(active.shape[0] * nb2):
        e, b = active[t // nb2], t % nb2
        for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
            m1 = min(offsets[e + 1], mc + M_CHUNK)
            for n in range(b * block2, min(D, (b + 1) * block2)):
                _dense_row(a, mc, m1, w2[e, n], s2[e, n], y, n)


@njit(parallel=True, **_OPTS)
def experts_int4(xe, xo, xs, offsets, active, w13, s13, w2, s2, ae, ao, asum, y, block13, block2):
    """Int4 twin of `experts_dense`: x split as for `linear_int4`; the activation is written
    straight into its even / odd halves (ae, ao [N, I/2]) and asum [N, I/group] is filled
    before the w2 pass."""
    D, I = w2.shape[1], 2 * w2.shape[2]
    half13 = w13.shape[2] // s13.shape[2]
    half2 = w2.shape[2] // s2.shape[2]
    nb13 = (I + block13 - 1) // block13
    for t in prange(active.shape[0] * nb13):
        e, b = active[t // nb13], t % nb13
        g = np.empty((M_CHUNK, 1), np.float32)
        u = np.empty((M_CHUNK, 1), np.float32)
        for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
            m1 = min(offsets[e + 1], mc + M_CHUNK)
            for j in range(b * block13, min(I, (b + 1) * block13)):
                _int4_row(xe[mc:m1], xo[mc:m1], xs[mc:m1], 0, m1 - mc, w13[e, j], s13[e, j], half13, g, 0)
                _int4_row(xe[mc:m1], xo[mc:m1], xs[mc:m1], 0, m1 - mc, w13[e, I + j], s13[e, I + j],
                          half13, u, 0)
                _silu_mul(g, u, ae if j % 2 == 0 else ao, mc, m1, j // 2)
    for m in prange(ae.shape[0]):
        for gi in range(asum.shape[1]):
            acc = np.float32(0.0)
            for j in range(gi * half2, gi * half2 + half2):
                acc += ae[m, j] + ao[m, j]
            asum[m, gi] = acc
    nb2 = (D + block2 - 1) // block2
    for t in prange(active.shape[0] * nb2):
        e, b = active[t // nb2], t % nb2
        for mc in range(offsets[e], offsets[e + 1], M_CHUNK):
            m1 = min(offsets[e + 1], mc + M_CHUNK)
            for n in range(b * block2, min(D, (b + 1) * block2)):
                _int4_row(ae, ao, asum, mc, m1, w2[e, n], s2[e, n], half2, y, n)
