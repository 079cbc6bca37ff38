"""The register tiles of the fp32 path (numba; imported by `_jit_linear` and the experts' kernels):
two weight rows (fp32 or int8 widened to fp32, or int4 split in fp32) against a chunk of x rows.

Tile order inside one work item: rows of x in chunks of `M_CHUNK`, then weight rows two at a time,
then x rows four at a time (dense; two or three rows left take a 2 × 2 tile) or two at a time
(int4): a 4 × 2 (2 × 2) tile of accumulators, so each loaded weight element serves several x rows
and each x element two weight rows; the weight block stays in L1/L2 while the next x chunk reuses it.

Dense rows (fp32 or int8) share one code path: `w[n, k]` widened to fp32, the row's scale applied
once after the reduction (ones for fp32). Int4 rows are viewed as [N, G, group/2] bytes and take x
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

import numpy as np
from numba import njit, types
from numba.extending import overload

from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._simd_gemv import gemv4_f32

M_CHUNK = 8  # x rows per pass over a block of weight rows (4 x rows × 2 weight rows stay in registers)
AHEAD = 4  # weight rows requested into L2 this many rows ahead (`_prefetch`), where the core spends
SHORT_ROW = 1024  # long on each weight line: 2+ x rows per weight row, or rows of ≤ SHORT_ROW bytes
# (measured: a [32000, 768] linear 1.14-1.30x at 2-16 rows and 0.84x at one; [8192, 256] 1.09x at
# one row; the experts' w13 pass on rows of 3 KB 0.88-0.95x, on rows of 1 KB 1.12-1.16x), or int8
# experts at one row (340M-style decode b=1: steps 1.06x; fp32 rows of 1 KB at one row: 0.96x)
F0, F1, F8, F16, F1_16 = (np.float32(v) for v in (0.0, 1.0, 8.0, 16.0, 0.0625))
# Index constants typed int64, not literal: a call that passes a literal 0 compiles its callee once more
# (numba specialises a kernel on each literal argument), one that passes I0 shares the int64 signature of
# the calls that pass a variable. Likewise a prange index (uint64) is passed as np.int64(i).
I0, I1 = np.int64(0), np.int64(1)


# --- two weight rows (n, n2) against x rows [m0, m1): a 4 × 2 register tile -----------------------
# Odd tails pass n2 = n, col2 = col (the row is computed twice, written once).

@njit(**OPTS)
def dense_rows(x, m0, m1, w, n, n2, s, s2, y, ym0, col, col2):
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
    while m < m1:  # the last x row of a chunk: a dot per weight row (a call of one x row takes `gemv_rows`)
        y[ym0 + m - m0, col] = dot_row(x, m, w, n) * s
        if n2 != n or col2 != col:
            y[ym0 + m - m0, col2] = dot_row(x, m, w, n2) * s2
        m += 1


def dot_rows4(x, m, w, n0, n1, n2, n3):
    """(Σ_k x[m, k]·w[n_i, k] for i in 0..3) in fp32 (w fp32 or int8 [N, K]): four weight rows in one
    pass over x, four read streams at once (`GEMV_ROWS`). Repeated rows (n3 = n2 at a tail) are
    computed twice. fp32 rows (x and w C-contiguous) take the vector tile of `_simd_gemv`, which asks
    for each stream's lines ahead into L2; others the plain loop."""
    raise NotImplementedError("dot_rows4 runs inside numba kernels only")


@overload(dot_rows4, jit_options={"fastmath": True})
def _dot_rows4(x, m, w, n0, n1, n2, n3):
    if all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (x, w)):
        return lambda x, m, w, n0, n1, n2, n3: gemv4_f32(x, m, w, n0, n1, n2, n3)
    return lambda x, m, w, n0, n1, n2, n3: _dot_rows4_loop(x, m, w, n0, n1, n2, n3)


@njit(**OPTS)
def _dot_rows4_loop(x, m, w, n0, n1, n2, n3):
    """`dot_rows4` in a plain loop (int8 rows widened to fp32; any layout)."""
    a0 = a1 = a2 = a3 = F0
    for k in range(w.shape[1]):
        xk = x[m, k]
        a0 += xk * np.float32(w[n0, k])
        a1 += xk * np.float32(w[n1, k])
        a2 += xk * np.float32(w[n2, k])
        a3 += xk * np.float32(w[n3, k])
    return a0, a1, a2, a3


@njit(**OPTS)
def dot_rows8(x, m, w, n0, n1, n2, n3, n4, n5, n6, n7):
    """`dot_rows4` over eight weight rows: eight read streams at once (`GEMV_ROWS`)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = F0
    for k in range(w.shape[1]):
        xk = x[m, k]
        a0 += xk * np.float32(w[n0, k])
        a1 += xk * np.float32(w[n1, k])
        a2 += xk * np.float32(w[n2, k])
        a3 += xk * np.float32(w[n3, k])
        a4 += xk * np.float32(w[n4, k])
        a5 += xk * np.float32(w[n5, k])
        a6 += xk * np.float32(w[n6, k])
        a7 += xk * np.float32(w[n7, k])
    return a0, a1, a2, a3, a4, a5, a6, a7


def _gemv_rows_for_host() -> int:
    """Weight rows per pass of the fp32 GEMV at one x row: its read streams. Which count reads fastest
    depends on the memory system, not the instruction set (docs/cpu.md, "fp32 decode b=1 on AMD Zen";
    `benchmarks/ab_gemv_rows.py`): on the Intel Xeon host four rows read the [32000, 768] head at 31.5
    GB/s, eight at 28.1, one at 24.5–25. On the AMD EPYC (Zen 4) host, whose VM read rate moves between
    ~30 and ~58 GB/s, one row per pass (one stream per thread, as llama.cpp reads) kept up with the
    fast minutes (87–126 % of `W.sum` over the decode shapes, where four rows reached 54–90 % and eight
    60–89 %) and was within a few per cent of eight in the slow ones. So one on AMD Zen (host CPU
    name `znver*`, whatever variant the kernels compile for), four elsewhere."""
    from llvmlite import binding

    return 1 if binding.get_host_cpu_name().startswith("znver") else 4


GEMV_ROWS = _gemv_rows_for_host()  # read when numba loads the kernels (`runtime.jit()`): a constant, frozen
# into the callers' disk cache, which numba keys on the target CPU (the host's, or `isa.choose`'s) and `_cache`
# stamps with the host CPU's name — so a cache directory shared between an AMD and an Intel host recompiles
# when the other host used it last, never hands one host the other's pick


@njit(**OPTS)
def gemv_rows1(x, m, w, n0, n1, s, y, ym):
    for n in range(n0, n1):
        y[ym, n] = dot_row(x, m, w, n) * s[n]


@njit(**OPTS)
def gemv_rows4(x, m, w, n0, n1, s, y, ym):
    last = n1 - 1
    for n in range(n0, n1, 4):
        r = (n, min(n + 1, last), min(n + 2, last), min(n + 3, last))
        a = dot_rows4(x, m, w, r[0], r[1], r[2], r[3])
        for i in range(4):
            y[ym, r[i]] = a[i] * s[r[i]]


@njit(**OPTS)
def gemv_rows8(x, m, w, n0, n1, s, y, ym):
    last = n1 - 1
    for n in range(n0, n1, 8):
        r = (n, min(n + 1, last), min(n + 2, last), min(n + 3, last), min(n + 4, last), min(n + 5, last),
             min(n + 6, last), min(n + 7, last))
        a = dot_rows8(x, m, w, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7])
        for i in range(8):
            y[ym, r[i]] = a[i] * s[r[i]]


# gemv_rows(x, m, w, n0, n1, s, y, ym): y[ym, n] = s[n] · Σ_k x[m, k]·w[n, k] for the weight rows n in
# [n0, n1), GEMV_ROWS at a time (`dot_row` / `dot_rows4` / `dot_rows8`); w fp32 or int8 [N, K], s [N]
gemv_rows = {1: gemv_rows1, 4: gemv_rows4, 8: gemv_rows8}[GEMV_ROWS]


@njit(**OPTS)
def dot_row(x, m, w, n):
    """Σ_k x[m, k]·w[n, k] in fp32 (w fp32 or int8)."""
    acc = F0
    for k in range(w.shape[1]):
        acc += x[m, k] * np.float32(w[n, k])
    return acc


@njit(**OPTS)
def int4_rows(xq, xs, m0, m1, w, n, n2, s, y, ym0, col, col2):
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
def int4_dequant(w, n, s, out, r):
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
def int4_tile(xq, xs, m0, m1, w, n, n2, s, deq, y, ym0, col, col2):
    """`int4_rows`, or for 3+ x rows: widen rows n, n2 once into `deq` [2, 2, G, group/2] (L1)
    and run the dense 4 × 2 tile on them (the nibble split is then paid once per 8 x rows)."""
    if m1 - m0 < 3:
        int4_rows(xq, xs, m0, m1, w, n, n2, s, y, ym0, col, col2)
        return
    int4_dequant(w, n, s, deq, 0)
    int4_dequant(w, n2, s, deq, 1)
    M, K = xq.shape[0], 2 * w.shape[1] * w.shape[2]
    dense_rows(xq.reshape(M, K), m0, m1, deq.reshape(2, K), 0, 1, F1, F1, y, ym0, col, col2)
