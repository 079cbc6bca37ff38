"""fp32 vs all-int8 vs all-int4 decode on the CPU, in one process, runs taking turns; and the A/B of
the int8 integer path (`runtime.INT8_ROW`) on the all-int8 model.

  python benchmarks/make_cpu_bench_models.py mixtral /tmp/m340        # the Mixtral-style ~340M
  python benchmarks/bench_cpu_quant.py --model /tmp/m340 [--runs 5] [--threads 2] [--group 64]

Three deployments of the same checkpoint, packed on load: fp32; int8 experts + int8 dense projections;
int4-gG experts + int4-gG dense projections (attention, LM head; router and embedding stay fp32).
Each decode workload (`bench.throughput.plan_moetune`: `decode_steps` engine steps of a batch of B)
runs once per deployment per round, the order rotating each round, each run preceded by one sample of
the machine's read limit (`LimitSampler`). Prints per deployment and batch: tok/s (median; min–max),
MB read per token (dense weights + the distinct experts routed), GB/s and its share of the read limit
sampled beside its own runs. Then the INT8_ROW A/B: decode b=1 of the int8 model, the path switched
per run (on, off, off, on, ...), the ratio of the medians. Load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _deployments(path: str, group: int) -> dict[str, dict]:
    g = f"int4-g{group}"
    return {"fp32": {}, "int8": {"experts": "int8", "dense": "int8"}, g: {"experts": g, "dense": g}}


def _interleaved(plans: dict[str, object], runs: int, sampler) -> dict[str, list[float]]:
    """Each deployment's Planned run once per round, the order rotating; returns times per deployment."""
    names = list(plans)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(runs + 1):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            work = sampler.beside(plans[n].work, n + plans[n].workload, "read")
            arg = work.setup()
            start = time.perf_counter()
            work.fn(arg)
            if r:  # the first round warms up
                times[n].append(time.perf_counter() - start)
    return times


def _row(name: str, plan, times: list[float], sampler) -> str:
    from moetune.bench.timing import Timing

    t = Timing(statistics.median(times), min(times), max(times), len(times))
    row = plan.row(t, sampler.median(name + plan.workload))
    lo, hi = row.tokens / t.max_s, row.tokens / t.min_s
    return (f"  {name:<10} {row.workload:<12} {row.tokens_per_s:8.1f} tok/s ({lo:.1f}–{hi:.1f})  "
            f"{row.bytes_per_token / 1e6:7.1f} MB/token  {row.gbytes_per_s:5.1f} GB/s = "
            f"{row.gbytes_per_s / row.limit:.0%} of {row.limit:.1f} GB/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--group", type=int, default=64)
    args = p.parse_args()

    from moetune.engine.threads import choose_wait_policy, use_threads

    choose_wait_policy()
    use_threads(args.threads)
    import torch

    from moetune.bench.precision import precision_line
    from moetune.bench.roofline import LimitSampler
    from moetune.bench.throughput import BenchSettings, plan_moetune
    from moetune.config import parse_config
    from moetune.engine.build import build_model
    from moetune.kernels.cpu import runtime

    print(f"load before: {os.getloadavg()}")
    models = {}
    for name, quant in _deployments(args.model, args.group).items():
        cfg = {"model": {"path": args.model}, **({"quant": quant} if quant else {})}
        models[name] = build_model(parse_config(cfg, source="bench_cpu_quant"))
        print(f"{name}: {precision_line(models[name])}")
    sampler = LimitSampler(torch.device("cpu"))
    s = BenchSettings(decode_batches=tuple(args.batch), decode_steps=args.decode_steps, runs=args.runs)
    planned = {n: plan_moetune(m, s) for n, m in models.items()}
    for i, b in enumerate(args.batch):
        plans = {n: ps[1 + i] for n, (ps, _) in planned.items()}  # [0] is the prefill
        times = _interleaved(plans, args.runs, sampler)
        for n, plan in plans.items():
            print(_row(n, plan, times[n], sampler))
    for _, done in planned.values():
        done()
    _ab_int8_row(models["int8"], s, args.runs * 2, runtime)
    print(f"load after: {os.getloadavg()}")


def _ab_int8_row(model, s, runs: int, runtime) -> None:
    """decode b=1 of the int8 model with the integer path on and off, runs taking turns."""
    from dataclasses import replace

    from moetune.bench.throughput import plan_moetune
    from moetune.bench.timing import Work, measure_alternating

    plans, done = plan_moetune(model, replace(s, decode_batches=(1,)))
    work = plans[1].work

    def side(on: bool) -> Work:
        def setup():
            runtime.INT8_ROW = on
            return work.setup()
        return Work(work.fn, setup)

    on, off = measure_alternating(side(True), side(False), model.device, runs)
    runtime.INT8_ROW = True
    done()
    tok = plans[1].tokens
    print(f"  INT8_ROW A/B, int8 decode b=1: on {tok / on.median_s:.1f} tok/s ({tok / on.max_s:.1f}–{tok / on.min_s:.1f}), "
          f"off {tok / off.median_s:.1f} ({tok / off.max_s:.1f}–{tok / off.min_s:.1f}); "
          f"on/off {off.median_s / on.median_s:.3f}x")


if __name__ == "__main__":
    main()
