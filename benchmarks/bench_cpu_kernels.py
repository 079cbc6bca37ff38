"""Benchmark the CPU decode kernels (moetune.kernels.cpu) against torch, in weight bytes read per second.

  python benchmarks/bench_cpu_kernels.py [--quick] [--threads 2] [--repeat 7]

Decode-shaped matmuls are bound by reading the weights, so every row is reported as
  GB/s = weight bytes stored (data + scales) / median time      and      % of the read limit,
where the read limit is `W.sum()` over `--mats` distinct fp32 [N, K] weights (default 64 ×
[4096, 768] = 805 MB, so nothing is cache-resident), measured in the same run.

Groups (each timed round-robin: repeat r runs every case of the group once, the read-limit stream
included, so a neighbour's load on a shared machine hits all cases of a group alike):
- linear, M = 1, 4, 16 rows: torch F.linear fp32 vs moetune `linear` fp32 / int8 / int4 (group 64),
  one call per distinct matrix;
- experts, a Mixtral-style layer (D=768, I=2048, E=8, top-2) over `--layers` distinct layers,
  T = 1 and 16 tokens with seeded random routing; bytes = the active experts' w13 + w2; the torch
  twin is the per-expert loop (`fused_experts_cpu_ref`, fp32 only: for int8/int4 it would
  dequantise every call).
Each case: 2 warm-up runs, then `--repeat` runs: median, min..max, and GB/s at the min (the run
least disturbed by other processes). CPU code is synchronous, so `time.perf_counter` around the
call is the whole cost. First-call times (numba compile, or load from its disk cache) at the end.
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

Case = tuple[str, int, Callable[[], object]]  # (name, weight bytes one run reads, one run)


def nbytes(w) -> int:
    if isinstance(w, torch.Tensor):
        return w.numel() * w.element_size()
    return nbytes(w.data) + (nbytes(w.scale) if w.scale is not None else 0)


def run_group(title: str, cases: list[Case], repeat: int, warmup: int = 2) -> None:
    """Time the cases round-robin; the first case is the read-limit stream the others are compared to."""
    for _, _, fn in cases:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(repeat):
        for i, (_, _, fn) in enumerate(cases):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    limit = cases[0][1] / statistics.median(times[0]) / 1e9
    print(f"\n{title}")
    print(f"  {'case':<30} {'median ms':>10} {'min..max ms':>19} {'GB/s':>7} {'% limit':>8} {'best GB/s':>10}")
    for (name, nbytes_read, _), ts in zip(cases, times):
        med, lo, hi = statistics.median(ts), min(ts), max(ts)
        gbs = nbytes_read / med / 1e9
        print(f"  {name:<30} {med * 1e3:10.2f} {lo * 1e3:9.2f}..{hi * 1e3:<8.2f} {gbs:7.1f} {100 * gbs / limit:7.0f}%"
              f" {nbytes_read / lo / 1e9:10.1f}", flush=True)


def first_call(fn: Callable[[], object], name: str, log: dict[str, float]) -> None:
    t0 = time.perf_counter()
    fn()
    log[name] = time.perf_counter() - t0


def read_case(mats: list[torch.Tensor]) -> Case:
    return ("read limit: W.sum() fp32", nbytes(mats[0]) * len(mats), lambda: [w.sum() for w in mats])


def bench_linear(mats: list[torch.Tensor], repeat: int, log: dict[str, float]) -> None:
    K = mats[0].shape[1]
    formats = {"fp32": mats, "int8": [quantize_int8(w) for w in mats], "int4 g64": [quantize_int4(w, 64) for w in mats]}
    for M in (1, 4, 16):
        x = torch.randn(M, K)
        torch_case = ("torch F.linear fp32", nbytes(mats[0]) * len(mats), lambda: [F.linear(x, w) for w in mats])
        cases = [read_case(mats), torch_case]
        for name, ws in formats.items():
            if f"linear {name}" not in log:
                first_call(lambda: linear(x, ws[0]), f"linear {name}", log)
            cases.append((f"moetune linear {name}", nbytes(ws[0]) * len(ws), lambda ws=ws: [linear(x, w) for w in ws]))
        run_group(f"linear M={M}: {len(mats)} × [{mats[0].shape[0]}, {K}]", cases, repeat)


def route(T: int, E: int, top_k: int, D: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_sorted [T*top_k, D], offsets [E+1]) for random distinct top-k experts per token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)]).flatten()  # [T*K]
    order = torch.argsort(ids, stable=True)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(ids, minlength=E).cumsum(0)])  # [E+1]
    x = torch.randn(T, D, generator=g)
    return x[order // top_k].contiguous(), offsets


def bench_experts(mats: list[torch.Tensor], layers: int, repeat: int, quick: bool, log: dict[str, float]) -> None:
    E, top_k, D, I = 8, 2, 768, (512 if quick else 2048)
    g = torch.Generator().manual_seed(1)
    fp32 = [(torch.randn(E, 2 * I, D, generator=g) * 0.02, torch.randn(E, D, I, generator=g) * 0.02)
            for _ in range(layers)]
    formats = {"fp32": fp32, "int8": [(quantize_int8(a), quantize_int8(b)) for a, b in fp32],
               "int4 g64": [(quantize_int4(a, 64), quantize_int4(b, 64)) for a, b in fp32]}
    for T in (1, 16):
        x, off = route(T, E, top_k, D, seed=T)
        active = int((off[1:] > off[:-1]).sum())
        cases = [read_case(mats)]
        for name, ws in [("torch twin fp32", fp32)] + [(f"moetune {k}", v) for k, v in formats.items()]:
            fn = fused_experts_cpu_ref if name.startswith("torch") else fused_experts_cpu
            if fn is fused_experts_cpu and f"experts {name}" not in log:
                first_call(lambda: fn(x, off, *ws[0]), f"experts {name}", log)
            per_layer = (nbytes(ws[0][0]) + nbytes(ws[0][1])) * active // E
            cases.append((name, per_layer * layers, lambda fn=fn, ws=ws: [fn(x, off, a, b) for a, b in ws]))
        run_group(f"experts T={T} (D={D}, I={I}, E={E}, top-{top_k}; {active} active experts, {layers} layers)",
                  cases, repeat)


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
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"threads={args.threads}, repeat={args.repeat}, load average before: {' '.join(load)}")
    log: dict[str, float] = {}
    bench_linear(ws, args.repeat, log)
    bench_experts(ws, 1 if args.quick else args.layers, args.repeat, args.quick, log)
    firsts = ", ".join(f"{k} {v:.2f}s" for k, v in log.items())
    print(f"\nfirst call (numba compile, or load from its disk cache): {firsts}")


if __name__ == "__main__":
    main()
