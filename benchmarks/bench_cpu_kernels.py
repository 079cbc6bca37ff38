"""Benchmark the CPU decode kernels (moetune.kernels.cpu) against torch, in weight bytes read per second.

  python benchmarks/bench_cpu_kernels.py [--quick] [--threads 2] [--repeat 7]

Decode-shaped matmuls are bound by reading the weights, so every row is reported as
  GB/s = weight bytes stored (data + scales) / median time      and      % of the read limit,
where the read limit is `W.sum()` over the same fp32 bytes, measured in the same run.

Linear: `--mats` distinct [N, K] weights (default 64 × [4096, 768] fp32 = 805 MB, so nothing is
cache-resident); one timed run calls the kernel once on each matrix, for M = 1, 4, 16 rows.
Experts: a Mixtral-style layer (D=768, I=2048, E=8, top-2) on `--layers` distinct layers, T=1 and
T=16 tokens with seeded random routing; bytes = the active experts' w13 + w2. The torch twin is the
per-expert loop (`fused_experts_cpu_ref`, fp32 only: for int8/int4 it would dequantise every call).
Each row: warm-up, then the median of `--repeat` runs, with min..max (and GB/s at the min: on a
shared machine the best run is the one least disturbed by other processes). CPU code is synchronous, so
`time.perf_counter` around the call is the whole cost. First-call times (compile or cache load)
are printed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from moetune.kernels.cpu import (fused_experts_cpu, fused_experts_cpu_ref, linear, quantize_int4, quantize_int8,
                                 set_threads)


def timed(fn: Callable[[], object], repeat: int, warmup: int = 2) -> tuple[float, float, float]:
    """(median, min, max) seconds of fn() after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def nbytes(w) -> int:
    if isinstance(w, torch.Tensor):
        return w.numel() * w.element_size()
    return nbytes(w.data) + (nbytes(w.scale) if w.scale is not None else 0)


class Table:
    def __init__(self, limit_gbs: float):
        self.limit = limit_gbs
        print(f"{'case':<44} {'median ms':>10} {'min..max ms':>17} {'GB/s':>7} {'% limit':>8} {'best GB/s':>10}")

    def row(self, name: str, bytes_read: int, t: tuple[float, float, float]) -> None:
        med, lo, hi = t
        gbs = bytes_read / med / 1e9
        print(f"{name:<44} {med * 1e3:10.2f} {lo * 1e3:8.2f}..{hi * 1e3:<8.2f} {gbs:7.1f} {100 * gbs / self.limit:7.0f}%"
              f" {bytes_read / lo / 1e9:10.1f}", flush=True)


def bench_linear(table: Table, mats: list[torch.Tensor], repeat: int, first_calls: dict) -> None:
    K = mats[0].shape[1]
    formats = {"fp32": mats, "int8": [quantize_int8(w) for w in mats], "int4 g64": [quantize_int4(w, 64) for w in mats]}
    for M in (1, 4, 16):
        x = torch.randn(M, K)
        table.row(f"torch F.linear fp32      M={M:<2}", nbytes(mats[0]) * len(mats),
                  timed(lambda: [F.linear(x, w) for w in mats], repeat))
        for name, ws in formats.items():
            if (name, "linear") not in first_calls:
                t0 = time.perf_counter()
                linear(x, ws[0])
                first_calls[(name, "linear")] = time.perf_counter() - t0
            table.row(f"moetune linear {name:<9} M={M:<2}", nbytes(ws[0]) * len(ws),
                      timed(lambda: [linear(x, w) for w in ws], repeat))


def route(T: int, E: int, top_k: int, D: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_sorted [T*top_k, D], offsets [E+1]) for random distinct top-k experts per token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)]).flatten()  # [T*K]
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=E)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])  # [E+1]
    x = torch.randn(T, D, generator=g)
    return x[order // top_k].contiguous(), offsets


def bench_experts(table: Table, layers: int, repeat: int, quick: bool, first_calls: dict) -> None:
    E, top_k, D, I = 8, 2, 768, (512 if quick else 2048)
    g = torch.Generator().manual_seed(1)
    fp32 = [(torch.randn(E, 2 * I, D, generator=g) * 0.02, torch.randn(E, D, I, generator=g) * 0.02)
            for _ in range(layers)]
    formats = {"fp32": fp32, "int8": [(quantize_int8(a), quantize_int8(b)) for a, b in fp32],
               "int4 g64": [(quantize_int4(a, 64), quantize_int4(b, 64)) for a, b in fp32]}
    for T in (1, 16):
        x, off = route(T, E, top_k, D, seed=T)
        active = int((off[1:] > off[:-1]).sum())
        for name, ws in [("torch twin fp32", fp32)] + [(f"moetune {k}", v) for k, v in formats.items()]:
            fn = fused_experts_cpu_ref if name.startswith("torch") else fused_experts_cpu
            if fn is fused_experts_cpu and (name, "experts") not in first_calls:
                t0 = time.perf_counter()
                fn(x, off, *ws[0])
                first_calls[(name, "experts")] = time.perf_counter() - t0
            per_layer = (nbytes(ws[0][0]) + nbytes(ws[0][1])) * active // E
            table.row(f"experts {name:<17} T={T:<2} act={active}", per_layer * layers,
                      timed(lambda: [fn(x, off, a, b) for a, b in ws], repeat))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes (a smoke test, numbers mean little)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--mats", type=int, default=64)
    p.add_argument("--layers", type=int, default=6, help="distinct expert layers (6 × 151 MB fp32)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    set_threads(args.threads)
    N, K, mats = (1024, 256, 8) if args.quick else (4096, 768, args.mats)
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(N, K, generator=g) for _ in range(mats)]
    read = timed(lambda: [w.sum() for w in ws], args.repeat)
    limit = nbytes(ws[0]) * mats / read[0] / 1e9
    print(f"threads={args.threads}; {mats} × [{N}, {K}] fp32 = {nbytes(ws[0]) * mats / 1e6:.0f} MB; read limit "
          f"(W.sum over the same bytes) = {limit:.1f} GB/s median, {nbytes(ws[0]) * mats / read[1] / 1e9:.1f} best")
    table, first_calls = Table(limit), {}
    bench_linear(table, ws, args.repeat, first_calls)
    del ws
    bench_experts(table, 1 if args.quick else args.layers, args.repeat, args.quick, first_calls)
    print("first call (numba compile, or load from its on-disk cache): " +
          ", ".join(f"{k[1]} {k[0]} {v:.2f}s" for k, v in first_calls.items()))


if __name__ == "__main__":
    main()
