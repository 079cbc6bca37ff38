"""Step time by phase on the TP × EP mesh: TP ∈ {1, 2} × EP ∈ {1, 2}, prefill of one 512-token prompt
and decode at batch 1 and 16 per data-parallel group, through the real `moetune profile`.

    python benchmarks/bench_tp_mesh_phases.py [--model DIR|NAME] [--make-mixtral-340m DIR] [--keep DIR]
        [--cells 1x1,2x1]

Each cell is one profile run (every rank measured); the figures are rank 0's DP group's merged
step medians and phase shares from summary.json. collective share = (tp_allreduce + tp_embed +
tp_gather + dispatch + combine) seconds / step seconds. Beside each measured cell, the simulator's
estimate of the same deployment predicted from the TP 1 × EP 1 run of that workload (`moetune
simulate --trace REF --recipe CELL/recipe.yaml --num-requests N --calibrate-on trace`: calibrated
on the one-rank run's own phase times, measured minutes before on the same machine, so the TP and
EP cells are predictions, not fits; mean ms per step of that kind and its collective share),
labelled estimated. A second estimate of each cell is calibrated on microbenchmarks instead
(`--calibrate-on microbenchmarks`, the default of simulate / search): the one-rank phases timed when the
estimate is made and, for TP and EP cells, the recipe's own path timed on its own (`tp/G2`: the engine's
TP group on two one-thread processes, its compute factor and seconds per all-reduce / gather;
`ep/R2` the same for expert parallelism), in a cache of its own under the run directory so that it is
measured now. `--cells 1x1,2x1` runs only those TP×EP cells (the 1x1 one first: the estimates replay
it). Timings on a shared CPU machine are noisy (±40 %): the load
average is printed beside each row. `--make-mixtral-340m DIR` first writes a
random-init Mixtral-style checkpoint of ~340M parameters (D 1024, 8 layers, 8 experts of I 1280,
vocab 32000) with transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from moetune.errors import MoetuneError

COLLECTIVES = ("tp_allreduce", "tp_embed", "tp_gather", "dispatch", "combine")
WORKLOADS = {  # name → (kind read from the summary, batch per DP group, input_len, output_len)
    "prefill 512": ("prefill", 1, 512, 1),
    "decode b=1": ("decode", 1, 32, 9),
    "decode b=16": ("decode", 16, 32, 9),
}


def make_mixtral_340m(out: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoints import build_tokenizer

    cfg = AutoConfig.for_model("mixtral", vocab_size=32000, hidden_size=1024, intermediate_size=1280,
                               num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                               num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", file=sys.stderr)
    model.save_pretrained(str(out))
    build_tokenizer(out)
    return out


def run_cell(model: str, tp: int, ep: int, workload: str, root: Path, ref: Path | None = None) -> dict:
    """ref: the TP 1 × EP 1 run of this workload, whose trace the estimate replays (None: this cell's own)."""
    kind, batch, input_len, output_len = WORKLOADS[workload]
    out = root / f"tp{tp}-ep{ep}-{workload.replace(' ', '_').replace('=', '')}"
    n = batch * ep  # batch requests per DP group
    args = [sys.executable, "-m", "moetune", "profile", "--model", model, "--device", "cpu", "--tp-size", str(tp),
            "--ep-size", str(ep), "--num-requests", str(n), "--batch-size", str(n), "--input-len", str(input_len),
            "--output-len", str(output_len), "--warmup-steps", "1", "-o", str(out)]
    got = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if got.returncode:
        raise SystemExit(f"tp {tp} ep {ep} {workload}: {got.stderr.strip().splitlines()[-1]}")
    k = json.loads((out / "summary.json").read_text())["kinds"][kind]
    phases = {p["phase"]: p for p in k["phases"]}
    collective = sum(phases[c]["share"] for c in COLLECTIVES if c in phases)
    top = sorted(k["phases"], key=lambda p: -p["share"])[:4]
    est = {how: _estimate_or_nan(ref or out, out, kind, n, how, f"tp {tp} ep {ep} {workload}")
           for how in ("trace", "microbenchmarks")}
    return {"run": out, "tp": tp, "ep": ep, "workload": workload, "step_ms": k["step_ms_median"],
            "p90_ms": k["step_ms_p90"],
            "collective_share": collective, "top": ", ".join(f"{p['phase']} {100 * p['share']:.0f}%" for p in top),
            "est_ms": est["trace"][0], "est_share": est["trace"][1],
            "mb_ms": est["microbenchmarks"][0], "mb_share": est["microbenchmarks"][1], "load": open("/proc/loadavg").read().split()[0]}


def _estimate_or_nan(ref: Path, cell: Path, kind: str, requests: int, how: str, what: str) -> tuple[float, float]:
    try:
        return estimate(ref, cell, kind, requests, how)
    except MoetuneError as exc:  # e.g. 4 ranks on this-machine's 2-rank description
        print(f"{what}: no {how} estimate: {exc}", file=sys.stderr)
        return float("nan"), float("nan")


def estimate(ref: Path, cell: Path, kind: str, requests: int, how: str = "trace") -> tuple[float, float]:
    """The simulator's ms per `kind` step and collective share of the cell's deployment (its recipe),
    replaying the reference run's trace, calibrated on `how`: the reference's own phase times (trace) or
    microbenchmarks taken now (cached beside the reference run: measured in this benchmark)."""
    from moetune.search.cost.machine_cache import CACHE_ENV
    from moetune.search.study.one import simulate_recipe
    from moetune.search.study.setup import Inputs

    os.environ[CACHE_ENV] = str(ref.parent / "calibration-cache")
    inputs = Inputs(str(ref), "this-machine", recipe=str(cell / "recipe.yaml"), num_requests=requests,
                    calibrate_on=how)
    setup, _, m = simulate_recipe(inputs)
    if setup.calibration is not None and how != "trace":
        print(f"{cell.name}: {setup.calibration.label()}", file=sys.stderr)
    phases = m.phases_ms[kind]
    return phases["step"], sum(phases.get(c, 0.0) for c in COLLECTIVES) / phases["step"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="stdlib-moe")
    ap.add_argument("--make-mixtral-340m", type=Path)
    ap.add_argument("--keep", type=Path, help="write the run dirs here (default: a temporary directory)")
    ap.add_argument("--cells", default="1x1,1x2,2x1,2x2", help="TPxEP cells, the 1x1 one first (default: all four)")
    a = ap.parse_args()
    cells = [tuple(int(x) for x in c.split("x")) for c in a.cells.split(",")]
    if cells[0] != (1, 1):
        raise SystemExit("--cells: the first cell must be 1x1 (the others' estimates replay its trace)")
    model = str(make_mixtral_340m(a.make_mixtral_340m)) if a.make_mixtral_340m else a.model
    print("| workload | TP | EP | ranks | step ms (median / p90) | collective share | largest phases | "
          "estimated step ms (trace-calibrated) | estimated collective share (trace) | "
          "estimated step ms (microbenchmarks) | estimated collective share (microbenchmarks) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = a.keep or tmp
        for workload in WORKLOADS:
            ref = None
            for tp, ep in cells:  # the one-rank run first: the others' estimates replay it
                r = run_cell(model, tp, ep, workload, Path(tmp), ref)
                ref = ref or r["run"]
                print(f"| {workload} | {tp} | {ep} | {tp * ep} | {r['step_ms']:.1f} / {r['p90_ms']:.1f} | "
                      f"{100 * r['collective_share']:.1f}% | {r['top']} | {_est(r['est_ms'], 1)} | "
                      f"{_est(100 * r['est_share'], 1, '%')} | {_est(r['mb_ms'], 1)} | "
                      f"{_est(100 * r['mb_share'], 1, '%')} | {r['load']} |", flush=True)


def _est(x: float, digits: int, unit: str = "") -> str:
    return "n/a (no estimate: see stderr)" if x != x else f"{x:.{digits}f}{unit} (estimated)"


if __name__ == "__main__":
    main()
