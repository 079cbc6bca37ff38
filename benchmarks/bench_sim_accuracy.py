"""Simulator accuracy on this machine: `simulate` (hardware this-machine, calibrated) vs `measure`
(the engine, R ranks as processes) for a set of recipes, per step kind and end to end.

  python benchmarks/bench_sim_accuracy.py --trace RUN [--num-requests 16] [--output-len 16] [--repeat 3]

Recipes (8): fp32 at R = 1 with all requests at once and a quarter of them, R = 2 contiguous and
EPLB with replicas; two quant mixes (all int8; hot 25 % fp32 + int4-g64, hot by the trace's loads);
offloading half the experts to host memory with prefetch depth 0 and 2. Each is run by the engine
with the recipe the search would emit (`to_config`) and simulated on `this-machine`. Measured
figures are the median of `--repeat` runs. Error = (estimated − measured) / measured.
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    from pathlib import Path

    from moetune.search.study.evaluate import MeasureEvaluator
    from moetune.search.study.measure import request_prompts
    from moetune.search.study.setup import Inputs, prepare
    from moetune.search.study.space import Deployment

    setup = prepare(Inputs(a.trace, "this-machine", num_requests=a.num_requests, output_len=a.output_len))
    prompts = request_prompts(setup.base, None, setup.workload)
    ev = MeasureEvaluator(setup.base, setup.sim, setup.workload, prompts, Path("/tmp/moetune-acc-placements"))
    n = a.num_requests
    recipes = [
        Deployment(1, 0, "contiguous", n, 8192), Deployment(1, 0, "contiguous", max(n // 4, 1), 8192),
        Deployment(2, 0, "contiguous", n, 8192), Deployment(2, 4, "eplb", n, 8192),
        Deployment(1, 0, "contiguous", n, 8192, "int8", 0.0),
        Deployment(1, 0, "contiguous", n, 8192, "int4", 0.25),
        Deployment(1, 0, "contiguous", n, 8192, offload_resident_fraction=0.5, offload_prefetch_depth=0),
        Deployment(1, 0, "contiguous", n, 8192, offload_resident_fraction=0.5, offload_prefetch_depth=2),
    ]
    print("| recipe | output tok/s est | meas | err | TPOT ms est | meas | err | TTFT ms est | meas | err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    errs = []
    for d in recipes:
        est = setup.sim.evaluate(d)
        runs = [ev.evaluate(d) for _ in range(a.repeat)]
        med = lambda k: statistics.median(getattr(r, k) for r in runs)  # noqa: E731
        row = [d.label()]
        for k in ("output_tok_s", "tpot_ms", "ttft_ms"):
            e, mv = getattr(est, k), med(k)
            err = (e - mv) / mv if mv else 0.0
            row += [f"{e:.4g}", f"{mv:.4g}", f"{err:+.0%}"]
            if k == "output_tok_s":
                errs.append(abs(err))
        print("| " + " | ".join(row) + " |", flush=True)
        for kind in ("prefill", "decode"):
            ph = est.phases_ms.get(kind)
            if ph:
                top = sorted(((v, p) for p, v in ph.items() if p not in ("step", "steps")), reverse=True)[:4]
                print(f"|   {kind} step {ph['step']:.3f} ms (estimated): " + ", ".join(f"{p} {v:.3f}" for v, p in top)
                      + " | | | | | | | | | |")
    print(f"\nmedian |error| of output tokens/s: {statistics.median(errs):.0%}; max {max(errs):.0%}")


if __name__ == "__main__":
    main()
