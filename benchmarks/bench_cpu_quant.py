"""fp32 vs all-int8 vs all-int4 decode on the CPU, in one process, runs taking turns; and A/Bs of
the integer kernel switches (`runtime.INT8_ROW`, `Q8_ROWS`, `Q4_ROWS`) on the packed models.

  python benchmarks/make_cpu_bench_models.py mixtral /tmp/m340        # the Mixtral-style ~340M
  python benchmarks/bench_cpu_quant.py --model /tmp/m340 [--runs 5] [--threads 2] [--group 64]

Three deployments of the same checkpoint, packed on load: fp32; int8 experts + int8 dense projections;
int4-gG experts + int4-gG dense projections (attention, LM head; router and embedding stay fp32).
Each decode workload (`bench.throughput.plan_moetune`: `decode_steps` engine steps of a batch of B)
runs once per deployment per round, the order rotating each round, each run preceded by one sample of
the machine's read limit (`LimitSampler`). Prints per deployment and batch: tok/s (median; min–max),
MB read per token (dense weights + the distinct experts routed), GB/s and its share of the read limit
sampled beside its own runs. Then the A/B of each kernel switch (`SWITCHES`: INT8_ROW at b=1, Q8_ROWS
at b=16 on the int8 model, Q4_ROWS at b=1 and 16 on the int4 one), the switch flipped per run (on,
off, off, on, ...), the ratio of the medians. Load average before and after.
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
    p.add_argument("--no-ab", action="store_true", help="skip the kernel-switch A/Bs")
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
    if not args.no_ab:
        _ab_switches(models, s, args.runs * 2, runtime)
    print(f"load after: {os.getloadavg()}")


# The kernel switches A/B'd on the packed models: (model, batch, label, on flags, off flags).
SWITCHES = (("int8", 1, "INT8_ROW (integer int8 at one row)", {"INT8_ROW": True}, {"INT8_ROW": False}),
            ("int8", 16, "Q8_ROWS 16 vs 1 (integer int8 at 2-16 rows)", {"Q8_ROWS": 16}, {"Q8_ROWS": 1}),
            ("int4", 1, "Q4_ROWS 1 vs 0 (integer int4 at one row)", {"Q4_ROWS": 1}, {"Q4_ROWS": 0}),
            ("int4", 16, "Q4_ROWS 16 vs 0 (integer int4 at 1-16 rows)", {"Q4_ROWS": 16}, {"Q4_ROWS": 0}))


def _ab_switches(models: dict, s, runs: int, runtime) -> None:
    """Each switch of SWITCHES on and off, decode at its batch, runs taking turns (on, off, off, on, ...)."""
    from dataclasses import replace

    from moetune.bench.throughput import plan_moetune
    from moetune.bench.timing import Work, measure_alternating

    for kind, batch, label, on_flags, off_flags in SWITCHES:
        model = next(m for n, m in models.items() if n.startswith(kind))
        saved = {k: getattr(runtime, k) for k in on_flags}
        plans, done = plan_moetune(model, replace(s, decode_batches=(batch,)))
        work = plans[1].work

        def side(flags: dict, work=work) -> Work:
            def setup():
                for k, v in flags.items():
                    setattr(runtime, k, v)
                return work.setup()
            return Work(work.fn, setup)

        on, off = measure_alternating(side(on_flags), side(off_flags), model.device, runs)
        for k, v in saved.items():
            setattr(runtime, k, v)
        done()
        tok = plans[1].tokens
        print(f"  A/B {label}, {kind} decode b={batch}: on {tok / on.median_s:.1f} tok/s "
              f"({tok / on.max_s:.1f}–{tok / on.min_s:.1f}), off {tok / off.median_s:.1f} "
              f"({tok / off.max_s:.1f}–{tok / off.min_s:.1f}); on/off {off.median_s / on.median_s:.3f}x")


if __name__ == "__main__":
    main()
