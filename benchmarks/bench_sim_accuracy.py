"""Simulator accuracy on this machine: `simulate` (hardware this-machine) vs `measure` (the engine,
R ranks as processes) for a set of recipes, from one or more traces of the same workload (say one
profiled beside a CPU hog and one profiled quiet).

  python benchmarks/bench_sim_accuracy.py --trace BUSY_RUN --trace QUIET_RUN [--num-requests 16]
         [--output-len 16] [--repeat 3]

Recipes (8): fp32 at R = 1 with all requests at once and a quarter of them, R = 2 contiguous and
EPLB with replicas; two quant mixes (all int8; hot 25 % fp32 + int4-g64, hot by the trace's loads);
offloading half the experts to host memory with prefetch depth 0 and 2. Each is run by the engine
with the recipe the search would emit (`to_config`) and simulated on `this-machine`.

Per trace, the machine state it was recorded in (env.json `machine`) and two estimates: calibrated
on microbenchmarks taken now (the default; measured afresh for the first trace, then cached, so
every trace shares them) and on
the trace's own phase times (the old way, for comparison). `--repeat` rounds, each a fresh
microbenchmark calibration (its estimates for every trace) followed by one engine run of every
recipe, so that calibrations and measurements take turns under whatever load the machine has;
figures are medians over rounds, measured ones with their spread (min–max), and the 1-minute load
average before each run is printed. Error = (estimated − measured) / measured output tok/s.
"""

from __future__ import annotations

import argparse
import os
import statistics


def recipes(n: int) -> list:
    from moetune.search.cost.deployment import Deployment

    return [
        Deployment(1, 0, "contiguous", n, 8192), Deployment(1, 0, "contiguous", max(n // 4, 1), 8192),
        Deployment(2, 0, "contiguous", n, 8192), Deployment(2, 4, "eplb", n, 8192),
        Deployment(1, 0, "contiguous", n, 8192, "int8", 0.0),
        Deployment(1, 0, "contiguous", n, 8192, "int4", 0.25),
        Deployment(1, 0, "contiguous", n, 8192, offload_resident_fraction=0.5, offload_prefetch_depth=0),
        Deployment(1, 0, "contiguous", n, 8192, offload_resident_fraction=0.5, offload_prefetch_depth=2),
    ]


def estimates(traces: list[str], a, how: str) -> tuple[list, list]:
    """Per trace: its Setup and the output tok/s estimate of every recipe, calibrated `how`."""
    from moetune.search.study.setup import Inputs, prepare

    setups, est = [], []
    for i, t in enumerate(traces):  # microbenchmarks measured afresh for the first trace, cached for the rest
        s = prepare(Inputs(t, "this-machine", num_requests=a.num_requests, output_len=a.output_len, calibrate_on=how,
                           recalibrate=(i == 0 and how == "microbenchmarks")))
        setups.append(s)
        est.append([s.sim.evaluate(d) for d in recipes(a.num_requests)])
    return setups, est


def measured(a) -> tuple[list, list[list], list[list], list[float]]:
    """--repeat rounds, each a fresh calibration (the estimates of every trace) and then one run of every
    recipe, so that calibration and measurement take turns under the same load; the load before each run."""
    from pathlib import Path

    from moetune.search.study.evaluate import MeasureEvaluator
    from moetune.search.study.measure import request_prompts

    n = len(recipes(a.num_requests))
    runs: list[list] = [[] for _ in range(n)]
    ests: list[list] = [[[] for _ in range(n)] for _ in a.trace]  # [trace][recipe] → per round
    loads, setups = [], []
    for _ in range(a.repeat):
        setups, est = estimates(a.trace, a, "microbenchmarks")
        for j, per in enumerate(est):
            for i, m in enumerate(per):
                ests[j][i].append(m.output_tok_s)
        setup = setups[0]
        prompts = request_prompts(setup.base, None, setup.workload)
        ev = MeasureEvaluator(setup.base, setup.sim, setup.workload, prompts, Path("/tmp/moetune-acc-placements"))
        for i, d in enumerate(recipes(a.num_requests)):
            loads.append(os.getloadavg()[0])
            runs[i].append(ev.evaluate(d).output_tok_s)
        print(f"  round: {setups[0].calibration.label()}", flush=True)
    return setups, ests, runs, loads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True, action="append", help="a run dir; give it twice (busy, quiet)")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    from moetune.profile.machine import machine_state, state_distance

    print(f"load before: {open('/proc/loadavg').read().strip()}")
    _, old = estimates(a.trace, a, "trace")
    setups, ests, runs, loads = measured(a)
    now = machine_state()
    for t, s in zip(a.trace, setups):
        print(f"- trace {t}: recorded {state_distance(s.source.machine_state, now)}")
    print()
    names = [os.path.basename(t.rstrip("/")) for t in a.trace]
    head = ["recipe", *(f"est µb {n}" for n in names), "µb max/min", *(f"est trace {n}" for n in names),
            "measured (min–max)", *(f"err µb {n}" for n in names), *(f"err trace {n}" for n in names)]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    errs: dict[str, list[float]] = {n: [] for n in names}
    diffs = []
    for i, d in enumerate(recipes(a.num_requests)):
        mv = statistics.median(runs[i])
        e = [statistics.median(ests[j][i]) for j in range(len(names))]
        o = [old[j][i].output_tok_s for j in range(len(names))]
        diffs.append(max(e) / min(e) - 1)
        for n, v in zip(names, e):
            errs[n].append(abs(v - mv) / mv)
        print("| " + " | ".join([d.label(), *(f"{v:.4g}" for v in e), f"{diffs[-1]:+.1%}", *(f"{v:.4g}" for v in o),
                                 f"{mv:.4g} ({min(runs[i]):.4g}–{max(runs[i]):.4g})",
                                 *(f"{(v - mv) / mv:+.0%}" for v in e), *(f"{(v - mv) / mv:+.0%}" for v in o)]) + " |")
    print(f"\nestimates of the traces differ by at most {max(diffs):.1%} (microbenchmark calibration)")
    for n in names:
        print(f"{n}: median |error| of output tok/s {statistics.median(errs[n]):.0%}, max {max(errs[n]):.0%}")
    print(f"load (1-min) before each measured run: median {statistics.median(loads):.2f}, "
          f"min {min(loads):.2f}, max {max(loads):.2f}; after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
