"""How many weight rows per pass the one-x-row fp32 GEMV should read at once on this host (`_jit_tiles.GEMV_ROWS`).

  python benchmarks/ab_gemv_rows.py [--shapes 2048x768,4096x768,768x2048,32000x768,1280x768] [--repeat 9]

Each shape: distinct fp32 weights totalling ≥ ~500 MB (so nothing is cache-resident), one x row, 2
threads each taking one contiguous half of the rows (the split `linear_dense` makes); the rows of
each half read 1, 2, 4 or 8 at a time (`gemv_rows1` / `gemv_rows4` / `gemv_rows8`, a plain loop
for 2), against torch's `W.sum()` over the same weights (one read stream per thread). Rounds in
turn: each repeat runs every case once. Prints GB/s (median, best) and % of `W.sum`'s median, with
the load average; the host's pick (`GEMV_ROWS`) is printed first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from numba import njit, prange

from moetune.kernels.cpu import set_threads
from moetune.kernels.cpu.runtime import jit

OPTS = dict(fastmath=True, nogil=True, error_model="numpy")


@njit(**OPTS)
def _rows2(x, w, s, y, n0, n1):
    for n in range(n0, n1 - 1, 2):
        a = b = np.float32(0.0)
        for k in range(w.shape[1]):
            a += x[0, k] * w[n, k]
            b += x[0, k] * w[n + 1, k]
        y[0, n], y[0, n + 1] = a * s[n], b * s[n + 1]
    if (n1 - n0) % 2:
        a = np.float32(0.0)
        for k in range(w.shape[1]):
            a += x[0, k] * w[n1 - 1, k]
        y[0, n1 - 1] = a * s[n1 - 1]


def _halves(rows_fn):
    @njit(parallel=True, **OPTS)
    def run(x, w, s, y):
        N = w.shape[0]
        for t in prange(2):
            rows_fn(x, w, s, y, N * t // 2, N * (t + 1) // 2)
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="2048x768,4096x768,768x2048,32000x768,1280x768")
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args()
    k = jit()
    set_threads(2)
    g1, g4, g8 = (k.GEMV_VARIANTS[r][0] for r in (1, 4, 8))
    one = njit(**OPTS)(lambda x, w, s, y, n0, n1: g1(x, 0, w, n0, n1, s, y, 0))
    four = njit(**OPTS)(lambda x, w, s, y, n0, n1: g4(x, 0, w, n0, n1, s, y, 0))
    eight = njit(**OPTS)(lambda x, w, s, y, n0, n1: g8(x, 0, w, n0, n1, s, y, 0))
    runs = {"1 row": _halves(one), "2 rows": _halves(_rows2), "4 rows": _halves(four), "8 rows": _halves(eight)}
    print(f"host pick GEMV_ROWS = {k.GEMV_ROWS}; load {os.getloadavg()[0]:.2f}")
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        mats = max(2, 500_000_000 // (N * K * 4))
        ws = [torch.randn(N, K) for _ in range(mats)]
        x = torch.randn(1, K).numpy()
        s, y = np.ones(N, np.float32), np.empty((1, N), np.float32)
        want = x @ ws[0].numpy().T
        cases = {"W.sum (read limit)": lambda w: w.sum()}
        for name, fn in runs.items():
            fn(x, ws[0].numpy(), s, y)
            assert np.allclose(y, want, rtol=1e-3, atol=1e-3), name
            cases[name] = lambda w, fn=fn: fn(x, w.numpy(), s, y)
        times = {name: [] for name in cases}
        for _ in range(args.repeat):
            for name, fn in cases.items():
                start = time.perf_counter()
                for w in ws:
                    fn(w)
                times[name].append(time.perf_counter() - start)
        nbytes = mats * N * K * 4
        base = statistics.median(times["W.sum (read limit)"])
        print(f"[{N}, {K}] × {mats}, load {os.getloadavg()[0]:.2f}")
        for name, ts in times.items():
            print(f"  {name:20s} {nbytes / statistics.median(ts) / 1e9:6.1f} GB/s (best {nbytes / min(ts) / 1e9:5.1f})"
                  f"  {base / statistics.median(ts):5.0%} of W.sum")


if __name__ == "__main__":
    main()
