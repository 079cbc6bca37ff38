"""A/B of the integer CPU linear kernels (issue 30): old vs new in one process, interleaved.

  flock /work/logs/cpu.lock python benchmarks/ab_cpu_int_kernels.py [--threads 2] [--repeat 9]

For each weight shape [N, K] and x rows M, every repeat runs each case once over `--mb` MB of
distinct weights (so nothing stays in cache) and, first, the read-limit stream (`W.sum()` over as
many bytes of fp32); reported: median ms per call, min..max, GB/s of weight bytes at the median
and its share of the read limit of the same repeats.

  int8  fp32-tile   each int8 byte widened to fp32, FMA (`linear_dense`; INT8_ROW off)
        int-loop    M = 1 only: the numba integer loop this issue replaced (copied here, `_old_q8`)
        int-simd    x to int16 per block of 64, `_simd` tiles (vpmaddwd / vpdpwssd)   (runtime.Q8_ROWS = 16)
  int4  fp32-split  the nibble split in fp32 (`linear_int4`)               (runtime.Q4_ROWS = 0)
        int-simd    x to int16 per group, nibbles in-register, `_simd.q4_tile_1xC`   (runtime.Q4_ROWS = 16)
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from moetune.kernels.cpu import linear, quantize_int4, quantize_int8, runtime, set_threads
from moetune.kernels.cpu.formats import weight_bytes

SHAPES = ((4096, 768), (32000, 768), (768, 2048))
ROWS = (1, 2, 4, 16)


def _old_q8():
    """The M = 1 integer kernel before `_simd` (numba loop; int32 written as np.int32(acc + ...))."""
    from numba import njit, prange

    from moetune.kernels.cpu._opts import OPTS

    @njit(**OPTS)
    def quantize_row(x, xq):
        """x [1, K] → xq per row (qmax min(32767, (2³¹−1) / (127·K)), the old rounding); returns its scale."""
        K = x.shape[1]
        top = np.float32(0.0)
        for k in range(K):
            top = max(top, abs(x[0, k]))
        qmax = np.float32(min(32767, 2147483647 // (127 * K)))
        inv = qmax / top if top > 0 else np.float32(0.0)
        for k in range(K):
            xq[0, k] = np.int16(min(max(np.rint(x[0, k] * inv), -qmax), qmax))
        return top / qmax

    @njit(**OPTS)
    def dot(xq, w, n):
        acc = np.int32(0)
        for k in range(w.shape[1]):
            acc = np.int32(acc + np.int32(xq[0, k]) * np.int32(w[n, k]))
        return acc

    @njit(parallel=True, **OPTS)
    def run(x, w, scale, y):
        xq = np.empty((1, x.shape[1]), np.int16)
        xs = quantize_row(x, xq)
        for n in prange(w.shape[0]):
            y[0, n] = np.float32(dot(xq, w, n)) * (scale[n] * xs)

    def call(x, w):
        y = torch.empty(1, w.data.shape[0])
        run(x.numpy(), w.data.numpy(), w.scale.numpy(), y.numpy())
        return y
    return call


def cases(shape, M, mb, old_q8):
    """[(name, bytes per repeat, fn)], the read-limit stream first."""
    N, K = shape
    g = torch.Generator().manual_seed(N + K)
    copies = max(2, int(mb * 1e6 // (N * K)))  # int8 bytes
    w8 = [quantize_int8(torch.randn(N, K, generator=g)) for _ in range(copies)]
    w4 = [quantize_int4(torch.randn(N, K, generator=g), 64) for _ in range(2 * copies)]
    stream = [torch.randn(N, K, generator=g) for _ in range(max(1, copies // 4))]
    x = torch.randn(M, K, generator=g)

    def with_switch(ws, **flags):
        def fn():
            saved = {k: getattr(runtime, k) for k in flags}
            for k, v in flags.items():
                setattr(runtime, k, v)
            for w in ws:
                linear(x, w)
            for k, v in saved.items():
                setattr(runtime, k, v)
        return fn

    out = [("read limit (fp32 sum)", sum(t.nbytes for t in stream), lambda: [t.sum() for t in stream])]
    b8, b4 = sum(weight_bytes(w) for w in w8), sum(weight_bytes(w) for w in w4)
    out.append(("int8 fp32-tile", b8, with_switch(w8, INT8_ROW=False)))
    if M == 1:
        out.append(("int8 int-loop", b8, lambda: [old_q8(x, w) for w in w8]))
    out.append(("int8 int-simd", b8, with_switch(w8, INT8_ROW=True, Q8_ROWS=16)))
    out.append(("int4 fp32-split", b4, with_switch(w4, Q4_ROWS=0)))
    out.append(("int4 int-simd", b4, with_switch(w4, Q4_ROWS=16)))
    return out


def run(shape, M, repeat, mb, old_q8) -> None:
    group = cases(shape, M, mb, old_q8)
    for _, _, fn in group:
        fn()
        fn()
    times = [[] for _ in group]
    for _ in range(repeat):
        for i, (_, _, fn) in enumerate(group):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    limit = group[0][1] / statistics.median(times[0]) / 1e9
    print(f"\n[{shape[0]}, {shape[1]}] M={M}  (read limit {limit:.1f} GB/s)")
    for (name, nbytes, _), ts in zip(group[1:], times[1:]):
        med = statistics.median(ts)
        gbs = nbytes / med / 1e9
        print(f"  {name:<16} {med * 1e3:8.2f} ms ({min(ts) * 1e3:.2f}..{max(ts) * 1e3:.2f})"
              f"  {gbs:6.1f} GB/s  {100 * gbs / limit:4.0f} %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--mb", type=float, default=96.0, help="MB of distinct int8 weights per case")
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    args = ap.parse_args()
    set_threads(args.threads)
    torch.set_num_threads(args.threads)
    old_q8 = _old_q8()
    for shape in SHAPES:
        for M in args.rows:
            run(shape, M, args.repeat, args.mb, old_q8)


if __name__ == "__main__":
    main()
