"""The peer's best disaggregated deployment priced by both tools, op group by op group (DeepSeek-V3 on 16×H200,
input 1,024 / output 256, TTFT ≤ 1 s / TPOT ≤ 50 ms): where moetune's figure for the same deployment parts
from AIConfigurator's. Every figure estimated.

  python benchmarks/peer_disagg.py --trace RUN --peer PEER_PYTHON [--engine vllm] [--write-doc]

1. The peer's best (`peer_best.py best`: its default agg-vs-disagg search), mapped to a moetune Deployment
   (`peer_cross.deployment_of`), priced by moetune at the peer's concurrency (cost/disagg.py: M/D/1 prefill
   queue, TTFT = wait + prefill + transfer, the decode batch by Little's law).
2. Each worker's step op group by op group: moetune's prefill step at the batch its steady state holds and
   its decode step at its steady batch (Simulator.price_schedule of disagg.Pricer's rows), beside the peer's
   static context step at its prefill batch and generation step at its decode batch (`peer_aiconfigurator.py`,
   the peer's own default token distribution, power law) — the two steps the peer's disaggregated row is
   built from: seq/s = min(prefill seq/s × 0.9, decode seq/s × 0.92) (its rate-matching degradation factors,
   aiconfigurator/sdk/picking.py), TTFT = 1.8 × its static prefill latency (`_AUTOSCALE_TTFT_CORRECTION_FACTOR`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG, HW, GPUS = "deepseek-v3.json", "16xH200", 16
ISL, OSL, TTFT, TPOT = 1024, 256, 1000.0, 50.0
SECTION = "peer-disagg"


def peer_static(peer_python: str, model_dir: Path, engine: str, batch: int, mesh: tuple[int, ...]) -> dict:
    """The peer's static estimate of one worker's mesh at `batch` per attention-DP rank (its power-law default)."""
    out = subprocess.run([peer_python, str(ROOT / "benchmarks/peer_aiconfigurator.py"), str(model_dir), "h200_sxm",
                          engine, "", str(ISL), str(OSL), str(batch), *map(str, mesh), "power_law"],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"peer_aiconfigurator.py failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def moetune_side(trace: str, engine: str, d, concurrency: int) -> dict:
    """moetune's figures of d at `concurrency` and its two workers' steps by op group (ms)."""
    from moetune.search.cost import disagg
    from moetune.search.study.setup import Inputs, prepare
    from peer_compare import grouped

    setup = prepare(Inputs(trace, HW, scale_model=str(ROOT / "recipes/scale" / CONFIG), input_len=ISL,
                           output_len=OSL, concurrency=concurrency, num_requests=3 * concurrency, engine=engine))
    sim, w = setup.sim, setup.workload
    m = sim.evaluate(d, w)
    info = m.detail["disagg"]
    p = disagg.Pricer(sim, d, w)
    steps = {}
    for side, worker, rows in (("prefill", p.pre, p.prefill_rows(info["prefill_batch"])),
                               ("decode", p.dec, p.decode_rows(info["decode_batch"]))):
        step_s, phases, _ = sim.price_schedule(worker, disagg.worker_schedule(worker, rows))
        ms = {k: 1e3 * float(v.sum()) for k, v in phases.items()}
        steps[side] = {"ms": 1e3 * float(step_s.sum()), "groups": grouped(ms)}
    return {"tok_s_gpu": m.output_tok_s_per_gpu, "ttft_ms": m.latency_ms["ttft"]["p50"],
            "tpot_ms": m.latency_ms["tpot"]["p50"], "disagg": info, "steps": steps}


def table(best: dict, d, conc: int, ours: dict, pre: dict, dec: dict) -> list[str]:
    from peer_compare import GROUPS, grouped

    row = best["rows"][best["chosen"]]
    info = ours["disagg"]
    p_groups, d_groups = grouped(pre["prefill_ops_ms"]), grouped(dec["decode_ops_ms"])
    lines = [f"Peer's best ({best['chosen']}): {d.label()}, {conc} in flight; the peer {row['tokens/s/gpu']:,.0f} "
             f"tok/s/GPU (TTFT {row['ttft']:.0f} / TPOT {row['tpot']:.1f} ms), moetune {ours['tok_s_gpu']:,.0f} "
             f"(TTFT {ours['ttft_ms']:.0f} / TPOT {ours['tpot_ms']:.1f} ms P50): "
             f"{ours['tok_s_gpu'] / row['tokens/s/gpu']:.2f}×.", "",
             "| step | moetune ms | peer ms | ratio | " + " | ".join(f"{g} (moetune / peer)" for g in GROUPS) + " |",
             "|---|---|---|---|" + "---|" * len(GROUPS)]
    for name, mine, theirs_ms, theirs in (
            (f"prefill, {info['prefill_batch']} prompt(s) / DP rank (peer: {int(row['(p)bs'])})", ours["steps"]["prefill"],
             pre["ttft_ms"], p_groups),
            (f"decode, {info['decode_batch']} / DP rank (peer: {int(row['(d)bs'])})", ours["steps"]["decode"],
             dec["tpot_ms"], d_groups)):
        cells = " | ".join(f"{mine['groups'][g]:.2f} / {theirs[g]:.2f}" for g in GROUPS)
        lines.append(f"| {name} | {mine['ms']:.2f} | {theirs_ms:.2f} | {mine['ms'] / theirs_ms:.2f} | {cells} |")
    pre_rps, dec_rps = info["prefill_capacity_rps"], info["decode_capacity_rps"]
    peer_rps = row["tokens/s/gpu"] * GPUS / OSL
    lines += ["", f"Steady state: moetune λ {info['request_rate']:.1f} req/s (prefill capacity {pre_rps:.1f}, load "
              f"{info['prefill_load']:.2f}, M/D/1 wait {1e3 * info['queue_s']:.0f} ms; decode capacity {dec_rps:.1f}); "
              f"the peer {peer_rps:.1f} req/s = min(prefill × 0.9, decode × 0.92) of its static steps, TTFT 1.8 × "
              f"its prefill step ({1.8 * pre['ttft_ms']:.0f} ms)."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--peer", required=True, help="Python of a venv holding aiconfigurator (peer_best.py)")
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--write-doc", action="store_true", help="write the table into docs/search-numbers.md's section")
    args = ap.parse_args()
    from peer_compare import PEER_MODELS, peer_models
    from peer_cross import deployment_of, peer

    from doc_section import loadavg

    load0 = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = peer_models(Path(tmp), args.peer) / PEER_MODELS[CONFIG]
        best = peer(args.peer, "best", str(model_dir), str(GPUS), "h200_sxm", args.engine, str(ISL), str(OSL),
                    str(TTFT), str(TPOT))
        if "error" in best or best.get("chosen") != "disagg":
            raise SystemExit(f"the peer's best is not disaggregated here: {best.get('error', best.get('chosen'))}")
        row = best["rows"]["disagg"]
        d, conc = deployment_of(row, GPUS)
        ours = moetune_side(args.trace, args.engine, d, conc)
        mesh = lambda side: tuple(int(row[f"({side}){k}"]) for k in ("tp", "dp", "moe_tp", "moe_ep"))  # noqa: E731
        pre = peer_static(args.peer, model_dir, args.engine, int(row["(p)bs"]), mesh("p"))
        dec = peer_static(args.peer, model_dir, args.engine, int(row["(d)bs"]), mesh("d"))
    lines = table(best, d, conc, ours, pre, dec)
    print("\n".join(lines))
    if args.write_doc:
        from doc_section import loadavg, section, write_section

        write_section(SECTION, section(SECTION, f"the peer's best disaggregated deployment op by op, {args.engine} "
                                       "tables (estimated)", lines, load0, loadavg()), ROOT / "docs/search-numbers.md")

if __name__ == "__main__":
    main()
