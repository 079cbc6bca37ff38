"""Step time by phase on the TP × EP mesh: TP ∈ {1, 2} × EP ∈ {1, 2}, prefill of one 512-token prompt
and decode at batch 1 and 16 per data-parallel group, through the real `moetune profile`.

    python benchmarks/bench_tp_mesh_phases.py [--model DIR|NAME] [--make-mixtral-340m DIR] [--keep DIR]

Each cell is one profile run (every rank measured); the figures are rank 0's DP group's merged
step medians and phase shares from summary.json. collective share = (tp_allreduce + tp_embed +
tp_gather + dispatch + combine) seconds / step seconds. Beside each measured cell, the simulator's
estimate of the same deployment predicted from the TP 1 × EP 1 run of that workload (`moetune
simulate --trace REF --recipe CELL/recipe.yaml --num-requests N --calibrate-on trace`: calibrated
on the one-rank run's own phase times, measured minutes before on the same machine, so the TP and
EP cells are predictions, not fits; mean ms per step of that kind and its collective share),
labelled estimated. Timings on a shared CPU machine are noisy (±40 %): the load
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
    try:
        est_ms, est_share = estimate(ref or out, out, kind, n)
    except MoetuneError as exc:  # e.g. 4 ranks on this-machine's 2-rank description
        est_ms, est_share = float("nan"), float("nan")
        print(f"tp {tp} ep {ep} {workload}: no estimate: {exc}", file=sys.stderr)
    return {"run": out, "tp": tp, "ep": ep, "workload": workload, "step_ms": k["step_ms_median"],
            "p90_ms": k["step_ms_p90"],
            "collective_share": collective, "top": ", ".join(f"{p['phase']} {100 * p['share']:.0f}%" for p in top),
            "est_ms": est_ms, "est_share": est_share, "load": open("/proc/loadavg").read().split()[0]}


def estimate(ref: Path, cell: Path, kind: str, requests: int) -> tuple[float, float]:
    """The simulator's ms per `kind` step and collective share of the cell's deployment (its recipe),
    replaying the reference run's trace calibrated on the reference's own phase times."""
    from moetune.search.study.one import simulate_recipe
    from moetune.search.study.setup import Inputs

    inputs = Inputs(str(ref), "this-machine", recipe=str(cell / "recipe.yaml"), num_requests=requests,
                    calibrate_on="trace")
    _, _, m = simulate_recipe(inputs)
    phases = m.phases_ms[kind]
    return phases["step"], sum(phases.get(c, 0.0) for c in COLLECTIVES) / phases["step"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="stdlib-moe")
    ap.add_argument("--make-mixtral-340m", type=Path)
    ap.add_argument("--keep", type=Path, help="write the run dirs here (default: a temporary directory)")
    a = ap.parse_args()
    model = str(make_mixtral_340m(a.make_mixtral_340m)) if a.make_mixtral_340m else a.model
    print("| workload | TP | EP | ranks | step ms (median / p90) | collective share | largest phases | "
          "estimated step ms | estimated collective share | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = a.keep or tmp
        for workload in WORKLOADS:
            ref = None
            for tp, ep in ((1, 1), (1, 2), (2, 1), (2, 2)):  # the one-rank run first: the others' estimates replay it
                r = run_cell(model, tp, ep, workload, Path(tmp), ref)
                ref = ref or r["run"]
                print(f"| {workload} | {tp} | {ep} | {tp * ep} | {r['step_ms']:.1f} / {r['p90_ms']:.1f} | "
                      f"{100 * r['collective_share']:.1f}% | {r['top']} | {_est(r['est_ms'], 1)} | "
                      f"{_est(100 * r['est_share'], 1, '%')} | {r['load']} |", flush=True)


def _est(x: float, digits: int, unit: str = "") -> str:
    return "n/a (no estimate: see stderr)" if x != x else f"{x:.{digits}f}{unit} (estimated)"


if __name__ == "__main__":
    main()
