"""The same deployment, balanced routing (`bench_cluster_cases.py --balanced`, issue 38): on each case asked, the
README command's winner (the search at the load the SLOs allow, TTFT ≤ 1 s / TPOT ≤ 50 ms at P90) and, with
PEER_PYTHON, AIConfigurator's own best (peer_cross.deployment_of), each re-priced by `moetune simulate --recipe`
at the load the same SLOs allow, with the trace's routing (`stats`, the default) and with `--scale-routing
balanced` (every expert equally loaded: what the peer prices, its token distribution aside) — so a gap to the
peer that is the trace's imbalance shows as such. Each at P90 (the search's default) and P50 (the SLOs on medians,
nearer the peer's means). Every figure estimated.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from peer_cross import ISL, OSL, ROOT, TPOT, TTFT, deployment_of, peer, recipe_of

ROUTINGS = ("stats", "balanced")
PERCENTILES = (90.0, 50.0)


def at_slo(trace: str, config: str, hw: str, engine: str, recipe: Path, routing: str, pct: float) -> dict:
    """`moetune simulate --recipe` at the highest load meeting the SLOs at percentile pct, routing as asked."""
    cmd = [sys.executable, "-m", "moetune", "simulate", "--trace", trace, "--recipe", str(recipe), "--hardware", hw,
           "--scale-model", str(ROOT / "recipes/scale" / config), "--input-len", str(ISL), "--output-len", str(OSL),
           "--slo-ttft-ms", str(TTFT), "--slo-tpot-ms", str(TPOT), "--slo-percentile", f"{pct:g}",
           "--scale-routing", routing, "--engine", engine, "--json", "-"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(out.stdout)


def cell(x: dict, pct: float) -> str:
    """tok/s/GPU (concurrency; TTFT / TPOT at pct, ms) of one at_slo answer."""
    if "error" in x:
        return f"– ({x['error']})"
    load = (x.get("detail") or {}).get("load") or {}
    lat, key = x["latency_ms"], f"p{pct:g}"
    return (f"{x['output_tok_s_per_gpu']:,.0f} ({load.get('concurrency', 0)}; "
            f"{lat['ttft'].get(key, 0.0):.0f} / {lat['tpot'].get(key, 0.0):.1f})")


def ratio(x: dict, ref: float | None) -> str:
    return f"{x['output_tok_s_per_gpu'] / ref:.2f}" if ref and "error" not in x else "–"


def rows_for(label: str, trace: str, config: str, hw: str, engine: str, d, tmp: Path, ref: float | None) -> list[str]:
    """One markdown row per routing: the deployment d at the SLOs' load at P90 and at P50, and / the peer's best."""
    recipe = recipe_of(trace, config, hw, engine, d, tmp, name="peer" if label.startswith("peer") else "winner")
    lines = []
    for routing in ROUTINGS:
        figs = {p: at_slo(trace, config, hw, engine, recipe, routing, p) for p in PERCENTILES}
        word = "balanced routing (same deployment)" if routing == "balanced" else "the trace's routing (stats)"
        lines.append(f"| {label}: {d.label()} | {word} | " + " | ".join(
            f"{cell(figs[p], p)} | {ratio(figs[p], ref)}" for p in PERCENTILES) + " |")
        print(lines[-1], flush=True)
    return lines


HEADER = ["| deployment | routing | P90 SLOs: tok/s/GPU (in flight; TTFT / TPOT P90 ms) | / peer's best | "
          "P50 SLOs: tok/s/GPU (in flight; TTFT / TPOT P50 ms) | / peer's best |", "|---|---|---|---|---|---|"]


def balanced_table(trace: str, case: tuple, engine: str, trials: int, tmp: Path, peer_python: str | None) -> list[str]:
    """The markdown lines for one case (module doc): the winner's rows, then the peer's best's (with PEER_PYTHON)."""
    from bench_cluster_cases import run_case  # benchmarks/, beside this script

    name, config, hw = case
    gpus = int(hw.split("x")[0])
    result, _ = run_case(trace, config, hw, 0, trials, tmp / f"out-{config}-{gpus}", engine=engine)
    lines = [f"{name} {gpus}×H200, {trials} trials; every figure estimated"]
    row, ref = None, None
    if peer_python:
        from peer_compare import PEER_MODELS, peer_models

        model_dir = str(peer_models(tmp / "models", peer_python) / PEER_MODELS[config])
        best = peer(peer_python, "best", model_dir, str(gpus), "h200_sxm", engine, str(ISL), str(OSL), str(TTFT),
                    str(TPOT))
        if "error" not in best and best["chosen"] in best["rows"]:
            row = best["rows"][best["chosen"]]
            ref = float(row["tokens/s/gpu"])
            lines.append(f"the peer's best ({best['chosen']}): {ref:,.0f} tok/s/GPU at {row.get('concurrency')} in "
                         f"flight (TTFT {row['ttft']:.0f} / TPOT {row['tpot']:.1f} ms, its means)")
        else:
            lines.append(f"the peer's best: {best.get('error', 'no best row')}")
    print("\n".join(lines + HEADER), flush=True)
    lines += HEADER
    if result.winner is None:
        lines.append("| moetune's winner: no feasible trial | – | – | – | – | – |")
    else:
        lines += rows_for("moetune's winner", trace, config, hw, engine, result.winner.deployment, tmp, ref)
    if row is not None:
        lines += rows_for("peer's best", trace, config, hw, engine, deployment_of(row, gpus, engine)[0], tmp, ref)
    return lines
