"""Where a decode step's time goes: the fused layers' two kernels (`attention_block`, `moe_block`)
and the rest (LM head, sampling, the Python of engine, scheduler, runner and the fused layers' seams),
per step, for the bench's decode workload of one batch size (`moetune.bench.throughput`).

  python benchmarks/prof_decode_step.py MODEL [--batch 1] [--runs 7] [--threads 2]

Each run decodes the bench's steps; the two kernels are timed around each call (perf_counter, ~0.1 µs
a call). Prints per run step / attention / moe / rest in ms per step, then their medians and the
load average before and after. Run it under `flock -x /work/cpu.lock` (it times); to compare two
checkouts, run it alternately with PYTHONPATH set to each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("GOMP_SPINCOUNT", "100000")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from moetune.engine.threads import use_threads

    use_threads(args.threads)
    from moetune.bench.throughput import BenchSettings, plan_moetune
    from moetune.config import parse_config
    from moetune.engine.build import build_model
    from moetune.kernels.cpu.runtime import jit_layer

    model = build_model(parse_config({"model": {"path": args.model}}, source="prof"))
    s = BenchSettings(decode_batches=(args.batch,), runs=3)
    plans, done = plan_moetune(model, s)
    plan = [p for p in plans if p.workload.startswith(f"decode b={args.batch}")][0]
    L = jit_layer()
    acc = {"attn": 0.0, "moe": 0.0}
    orig = {"attn": L.attention_block, "moe": L.moe_block}

    def timed(key):
        f = orig[key]

        def g(*a):
            t = time.perf_counter()
            r = f(*a)
            acc[key] += time.perf_counter() - t
            return r
        return g

    load = os.getloadavg()
    rows = []
    L.attention_block, L.moe_block = timed("attn"), timed("moe")
    for it in range(args.runs + 1):
        arg = plan.work.setup()
        acc["attn"] = acc["moe"] = 0.0
        t = time.perf_counter()
        plan.work.fn(arg)
        dt = time.perf_counter() - t
        if it:  # the first run warms up
            n = s.decode_steps
            rows.append((dt / n * 1e3, acc["attn"] / n * 1e3, acc["moe"] / n * 1e3, (dt - acc["attn"] - acc["moe"]) / n * 1e3))
    L.attention_block, L.moe_block = orig["attn"], orig["moe"]
    done()
    for r in rows:
        print("step %.3f ms  attn %.3f  moe %.3f  rest %.3f" % r)
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"median step {med[0]:.3f} ms  attn {med[1]:.3f}  moe {med[2]:.3f}  rest {med[3]:.3f}  "
          f"(rest min {min(r[3] for r in rows):.3f} max {max(r[3] for r in rows):.3f}); load {load} -> {os.getloadavg()}")


if __name__ == "__main__":
    main()
