"""In-process A/B of a packed model's prefill: int8 / int4 weights through torch's GEMM on panels widened
one at a time (`kernels/cpu/panels.py`, this checkout) against the other ways, in rounds taking turns.

  python benchmarks/ab_prefill_panels.py --model DIR --format int8|int4 [--rounds 8] [--len 512]

DIR is a packed checkpoint (`moetune quantize --policy int8 --dense int8`, or int4-g32 alike; the bench
models of make_cpu_bench_models.py). Sides:
  panels        this checkout's default for int8 (with VNNI and torch's `_int_mm`: x in int8 parts through
                torch's integer GEMM, `panels.int8_mm_t`); for int4 on hosts without VNNI (widened panels)
  widened       int8 weights on widened panels where the default takes the integer GEMM
  whole         every packed weight widened whole per call (`formats.dequantize`, the way before panels)
  int4-kernel   int4 weights on the interleaved kernels at every row count (the default with VNNI)
Each round runs one engine prefill of --len tokens per side (after one untimed), the sides in turn,
the order flipping each round. Prints tok/s per side (median, min-max) and each side's per-round ratio
against panels (median), with the load average. Run it under `flock -x /work/cpu.lock` (it times).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager

os.environ.setdefault("GOMP_SPINCOUNT", "100000")


def _sides(model_fmt: str):
    """name → a context manager that sets the engine's prefill paths for that side."""
    import torch.nn.functional as F

    from moetune.kernels.cpu import panels
    from moetune.kernels.cpu.formats import dequantize
    from moetune.model import linear as model_linear
    from moetune.moe import cpu_backend

    default_project, default_slot = model_linear.project, cpu_backend.packed_slot_experts
    default_takes, default_rows = panels.takes, cpu_backend.INT4_ROWS
    default_integer = panels.int8_integer_at_prefill

    def whole_slot(x, w13, w2, I):
        h = x @ dequantize(w13).t()  # [n, 2I]
        return (F.silu(h[:, :I]) * h[:, I:]) @ dequantize(w2).t()  # [n, D]

    def panel_project(x, weight, bias=None, small_m=0):
        if small_m and x.shape[0] > model_linear.LARGE_WEIGHT_M and panels.takes(x, weight):
            return panels.packed_linear(x, weight, bias)
        return default_project(x, weight, bias, small_m)

    @contextmanager
    def side(project, slot, takes, rows, integer=default_integer):
        model_linear.project, cpu_backend.packed_slot_experts = project, slot
        panels.takes, cpu_backend.INT4_ROWS, panels.int8_integer_at_prefill = takes, rows, integer
        try:
            yield
        finally:
            model_linear.project, cpu_backend.packed_slot_experts = default_project, default_slot
            panels.takes, cpu_backend.INT4_ROWS = default_takes, default_rows
            panels.int8_integer_at_prefill = default_integer

    sides = {"panels": lambda: side(panel_project, default_slot, default_takes, 16),
             "whole": lambda: side(default_project, whole_slot, lambda x, w: False, 16)}
    if model_fmt == "int8" and default_integer():  # the default takes the integer GEMM: widened panels apart
        sides["widened"] = lambda: side(panel_project, default_slot, default_takes, 16, lambda: False)
    if model_fmt == "int4":
        sides["int4-kernel"] = lambda: side(default_project, default_slot, default_takes, 1 << 30)
        if not panels.int4_kernel_at_prefill():  # the default project takes the panels: force the kernel
            from moetune.kernels.cpu import linear as cpu_linear

            def kernel_project(x, weight, bias=None, small_m=0):
                if small_m and x.shape[0] > model_linear.LARGE_WEIGHT_M and panels.takes(x, weight):
                    y = cpu_linear(x, weight)
                    return y if bias is None else y.add_(bias)
                return default_project(x, weight, bias, small_m)

            sides["int4-kernel"] = lambda: side(kernel_project, default_slot, default_takes, 1 << 30)
    return sides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--len", type=int, default=512, dest="length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--format", choices=("int8", "int4"), required=True, help="the checkpoint's packed format")
    a = ap.parse_args()
    from moetune.engine.threads import use_threads

    use_threads(a.threads)
    from moetune.bench.throughput import BenchSettings, plan_moetune
    from moetune.config import parse_config
    from moetune.engine.build import build_model
    from moetune.kernels.cpu import isa

    model = build_model(parse_config({"model": {"path": a.model}}, source="ab_prefill_panels"))
    plans, done = plan_moetune(model, BenchSettings(decode_batches=(1,), runs=1, prefill_len=a.length))
    prefill = next(p for p in plans if p.workload.startswith("prefill")).work.fn
    sides = _sides(a.format)
    load0 = open("/proc/loadavg").read().split()[:3]
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(a.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            with sides[name]():
                prefill()
                t = time.perf_counter()
                prefill()
                times[name].append(time.perf_counter() - t)
    done()
    print(f"model {a.model} ({a.format}) · prefill {a.length} tokens · threads {a.threads} · kernels {isa.describe()} · "
          f"rounds {a.rounds} · load {' '.join(load0)} → {' '.join(open('/proc/loadavg').read().split()[:3])}")
    for name, ts in times.items():
        ratio = statistics.median(p / s for p, s in zip(times["panels"], ts))  # this side's speed ÷ panels'
        print(f"  {name:12s} {a.length / statistics.median(ts):7.1f} tok/s ({a.length / max(ts):.1f}–"
              f"{a.length / min(ts):.1f})  speed ÷ panels {ratio:.3f}")


if __name__ == "__main__":
    main()
