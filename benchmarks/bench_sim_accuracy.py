"""Simulator accuracy on this machine: `simulate` (hardware this-machine) vs `measure` (the engine,
R ranks or a TP group as processes) for a set of recipes, from one or more traces of the same
workload (say one profiled beside a CPU hog and one profiled quiet).

  python benchmarks/bench_sim_accuracy.py --trace RUN [--trace RUN2] [--num-requests 16]
         [--output-len 16] [--repeat 3] [--only NAME,NAME] [--phases]

Recipes (`recipes`, 13, each with a short name for --only): fp32 at R = 1 with max_num_seqs 16, 8
and 4; R = 2 contiguous and EPLB with replicas; three quant mixes (all int8 experts; hot 25 % fp32 +
int4-g64, hot by the trace's loads; dense projections int8, `quant.dense`); offloading half the
experts to host memory with prefetch depth 0 and 2; a tensor-parallel group of 2 (tp_size 2 with the
experts whole, expert_tp_size 2 alone, and both). Each is run by the engine with the recipe the search
would emit (`to_config`) and simulated on `this-machine`.

`--repeat` rounds, each a fresh microbenchmark calibration (its estimates for every trace: base,
variants, EP ranks and TP groups timed again) followed by one engine run of every recipe, so that
calibrations and measurements take turns under whatever load the machine has; figures are medians
over rounds, each with its spread over rounds (min–max: an estimate moves with its calibration, a
few seconds of microbenchmarks), and the 1-minute load average before each run is recorded. Metrics compared (metrics.py's definitions, the same for both evaluators): output
tok/s, TTFT and TPOT (median over requests), and per step kind prefill tok/s and decode tok/s.
Error = (estimated − measured) / measured.

`--phases`: instead of the measured rounds, one calibration and, per recipe, one `moetune profile
--recipe` of the same workload (batch = min(requests, max_num_seqs)); per step kind, each phase's
share of the step, estimated vs profiled (shares, because the profile's clocks run the unfused probed
path, which the simulator's path factor scales away as a whole).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

METRICS = (("output_tok_s", "tok/s"), ("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"),
           ("prefill_tok_s", "prefill tok/s"), ("decode_tok_s", "decode tok/s"))
SHOWN_PHASES = ("attention", "experts", "offload_wait", "tp_allreduce", "tp_gather", "dispatch", "combine", "other")


def recipes(n: int) -> dict:
    """name → Deployment, n = requests (the burst all at once)."""
    from moetune.search.cost.deployment import Deployment

    return {
        "r1": Deployment(1, 0, "contiguous", n, 8192),
        "r1-seqs8": Deployment(1, 0, "contiguous", max(n // 2, 1), 8192),
        "r1-seqs4": Deployment(1, 0, "contiguous", max(n // 4, 1), 8192),
        "r2": Deployment(2, 0, "contiguous", n, 8192),
        "r2-eplb": Deployment(2, 4, "eplb", n, 8192),
        "int8": Deployment(1, 0, "contiguous", n, 8192, "int8", 0.0),
        "int4-hot": Deployment(1, 0, "contiguous", n, 8192, "int4", 0.25),
        "dense-int8": Deployment(1, 0, "contiguous", n, 8192, dense_format="int8"),
        "offload-pf0": Deployment(1, 0, "contiguous", n, 8192, offload_resident_fraction=0.5, offload_prefetch_depth=0),
        "offload-pf2": Deployment(1, 0, "contiguous", n, 8192, offload_resident_fraction=0.5, offload_prefetch_depth=2),
        "tp2": Deployment(1, 0, "contiguous", n, 8192, tp_size=2),
        "etp2": Deployment(1, 0, "contiguous", n, 8192, expert_tp_size=2),
        "tp2-etp2": Deployment(1, 0, "contiguous", n, 8192, tp_size=2, expert_tp_size=2),
    }


def chosen(a) -> dict:
    every = recipes(a.num_requests)
    names = a.only.split(",") if a.only else list(every)
    unknown = [x for x in names if x not in every]
    if unknown:
        raise SystemExit(f"--only: unknown recipe(s) {', '.join(unknown)}; known: {', '.join(every)}")
    return {x: every[x] for x in names}


def estimates(a, fresh: bool = True) -> list:
    """Per trace: its Setup and the Metrics of every chosen recipe; the microbenchmarks measured
    afresh for the first trace (when `fresh`), cached for the rest."""
    from moetune.search.study.setup import Inputs, prepare

    out = []
    for i, t in enumerate(a.trace):
        s = prepare(Inputs(t, "this-machine", num_requests=a.num_requests, output_len=a.output_len,
                           calibrate_on="microbenchmarks", recalibrate=fresh and i == 0))
        out.append((s, {name: s.sim.evaluate(d) for name, d in chosen(a).items()}))
    return out


def rounds(a) -> tuple[list, dict, dict, list]:
    """--repeat rounds, each a fresh calibration (the estimates of every trace) and then one run of every
    recipe, so that calibration and measurement take turns under the same load.
    Returns (setups, est[trace][recipe][metric] → per round, meas[recipe][metric] → per round, loads)."""
    from moetune.search.study.evaluate import MeasureEvaluator
    from moetune.search.study.measure import request_prompts

    picked = chosen(a)
    est = {j: {x: {k: [] for k, _ in METRICS} for x in picked} for j in range(len(a.trace))}
    meas = {x: {k: [] for k, _ in METRICS} for x in picked}
    loads, setups = [], []
    for r in range(a.repeat):
        per_trace = estimates(a)
        setups = [s for s, _ in per_trace]
        for j, (_, ms) in enumerate(per_trace):
            for x, m in ms.items():
                for k, _ in METRICS:
                    est[j][x][k].append(getattr(m, k))
        s0 = setups[0]
        prompts = request_prompts(s0.base, None, s0.workload)
        ev = MeasureEvaluator(s0.base, s0.sim, s0.workload, prompts, Path("/tmp/moetune-acc-placements"))
        for x, d in picked.items():
            loads.append(os.getloadavg()[0])
            m = ev.evaluate(d)
            for k, _ in METRICS:
                meas[x][k].append(getattr(m, k))
        print(f"  round {r + 1}/{a.repeat}: {s0.calibration.label()} (load {open('/proc/loadavg').read().strip()})",
              flush=True)
    return setups, est, meas, loads


def err(e: float, m: float) -> float:
    return (e - m) / m if m else float("nan")


def print_tables(a, est: dict, meas: dict) -> dict[str, list[float]]:
    """The tables (estimates of the first trace); returns |error| per metric over recipes."""
    picked = chosen(a)
    errs: dict[str, list[float]] = {k: [] for k, _ in METRICS}
    for group in (METRICS[:3], METRICS[3:]):
        head = ["recipe"] + [f"{label} {w}" for _, label in group for w in ("est (min–max)", "meas (min–max)", "err")]
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for x, d in picked.items():
            cells = [f"{x}: {d.label()}"]
            for k, _ in group:
                ests, runs = est[0][x][k], meas[x][k]  # each per round: the estimate moves with its calibration
                e, mv = statistics.median(ests), statistics.median(runs)
                errs[k].append(abs(err(e, mv)))
                cells += [f"{e:.4g} ({min(ests):.4g}–{max(ests):.4g})", f"{mv:.4g} ({min(runs):.4g}–{max(runs):.4g})",
                          f"{err(e, mv):+.0%}"]
            print("| " + " | ".join(cells) + " |")
        print()
    if len(a.trace) > 1:
        diff = max(max(statistics.median(est[j][x]["output_tok_s"]) for j in est) /
                   min(statistics.median(est[j][x]["output_tok_s"]) for j in est) - 1 for x in picked)
        print(f"estimates of the traces' output tok/s differ by at most {diff:.1%}")
    return errs


def profiled_shares(a, d, cfg, out: Path) -> dict:
    """`moetune profile --recipe` of the recipe on the bench's workload: kind → phase → (ms/step, share)."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    recipe = out / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    batch = min(a.num_requests, d.max_num_seqs)
    subprocess.run(["moetune", "profile", "--recipe", str(recipe), "--num-requests", str(a.num_requests),
                    "--batch-size", str(batch), "--output-len", str(a.output_len), "--out", str(out / "run")],
                   check=True, stdout=subprocess.DEVNULL)
    kinds = json.loads((out / "run" / "summary.json").read_text())["kinds"]
    return {k: {p["phase"]: (p["ms_per_step"], p["share"]) for p in v["phases"]} for k, v in kinds.items()}


def phase_table(a) -> None:
    """--phases: per recipe and step kind, each shown phase's share of the step, estimated vs profiled."""
    from moetune.search.study.evaluate import MeasureEvaluator

    (s0, est), *_ = estimates(a, fresh=True)
    ev = MeasureEvaluator(s0.base, s0.sim, s0.workload, (), Path("/tmp/moetune-acc-placements"))
    print("| recipe | kind | step ms est / profiled | " + " | ".join(f"{p} est / prof" for p in SHOWN_PHASES)
          + " |\n|" + "---|" * (3 + len(SHOWN_PHASES)))
    with tempfile.TemporaryDirectory() as tmp:
        for x, d in chosen(a).items():
            print(f"  {x}: load {open('/proc/loadavg').read().strip()}", flush=True)
            prof = profiled_shares(a, d, ev.config(d), Path(tmp) / x)
            for kind in ("prefill", "decode"):
                e, p = est[x].phases_ms.get(kind), prof.get(kind)
                if not e or not p:
                    continue
                p_step = sum(ms for ms, _ in p.values())
                cells = [x, kind, f"{e['step']:.3g} / {p_step:.3g}"]
                for ph in SHOWN_PHASES:
                    es, ps = e.get(ph, 0.0) / e["step"], p.get(ph, (0.0, 0.0))[1]
                    cells.append(f"{es:.0%} / {ps:.0%}")
                print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True, action="append", help="a run dir (give several: busy, quiet)")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated recipe names (default: all; see `recipes`)")
    ap.add_argument("--phases", action="store_true", help="per-phase shares against `moetune profile --recipe`")
    a = ap.parse_args()
    chosen(a)  # an unknown --only name fails before any work
    print(f"load before: {open('/proc/loadavg').read().strip()}", flush=True)
    if a.phases:
        phase_table(a)
        print(f"load after: {open('/proc/loadavg').read().strip()}")
        return
    from moetune.profile.machine import machine_state, state_distance

    setups, est, meas, loads = rounds(a)
    now = machine_state()
    for t, s in zip(a.trace, setups):
        print(f"- trace {t}: recorded {state_distance(s.source.machine_state, now)}")
    print()
    errs = print_tables(a, est, meas)
    for k, label in METRICS:
        print(f"median |error| of {label}: {statistics.median(errs[k]):.0%}, max {max(errs[k]):.0%}")
    print(f"load (1-min) before each measured run: median {statistics.median(loads):.2f}, "
          f"min {min(loads):.2f}, max {max(loads):.2f}; after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
