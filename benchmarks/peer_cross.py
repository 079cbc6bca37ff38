"""Each tool's winner priced by the other (`bench_cluster_cases.py --cross PYTHON`): on each cluster case,
moetune's search winner (the README's command: the load the SLOs allow, TTFT ≤ 1 s / TPOT ≤ 50 ms at P90)
priced by AIConfigurator's steady-state estimate (`cli_estimate(mode="agg")`, its `disagg` for a
disaggregated winner) at the same concurrency, and AIConfigurator's own best (its default agg-vs-disagg
search, the same SLOs) priced by `moetune simulate --recipe` of the equivalent recipe at its concurrency.
Each side at its own defaults: moetune replays the trace's routing, the peer its power-law token
distribution; both on the same engine's measured tables (moetune with the gpu-db extra).

The mapping (what the engines run): a moetune deployment of R EP ranks × G TP ranks is vLLM's
`-tp G -dp R --enable-expert-parallel` (the peer's tp G, attention DP R, MoE EP R·G; R = 1: MoE TP G);
a general mesh its own (tp, attention DP, MoE TP, MoE EP); a batch per attention-DP rank = concurrency /
DP; expert formats fp8 → fp8 (fp8_block for an fp8 checkpoint or SGLang), int4 → int4_wo, a hot fraction
(a mix the peer cannot price) as all experts in the low format; the step budget: the peer's `ctx_tokens`
is the prompt tokens of its mixed step, beside the decode rows, where vLLM's max_num_batched_tokens counts
both, so ctx_tokens = max_num_batched_tokens less the batch (the whole budget where the batch takes it all).
The peer's best, back: its (tp, dp, moe_tp, moe_ep) as the legacy mesh where DP = MoE EP and TP = MoE TP,
else a general mesh (all-gather mode where it is not pure EP), max_num_seqs its batch, max_num_batched_tokens
what its own vLLM launch file sets (`launch_tokens`), replicas the GPUs over a worker's; disaggregated: P and
D workers, each worker's mesh, the prefill batch × ISL as its step budget.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISL, OSL, TTFT, TPOT = 1024, 256, 1000.0, 50.0
LOW = {"fp8": "fp8", "fp8_block": "fp8", "int4_wo": "int4", "int8_wo": "int8"}


def peer(peer_python: str, *args: str) -> dict:
    out = subprocess.run([peer_python, str(ROOT / "benchmarks/peer_best.py"), *args], capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def quant_modes(d, fp8_checkpoint: bool, engine: str) -> dict:
    fp8 = "fp8_block" if fp8_checkpoint or engine == "sglang" else "fp8"
    low = d.quant_low_format
    moe = {"none": fp8 if fp8_checkpoint else "bfloat16", "fp8": fp8, "int4": "int4_wo", "int8": "int8_wo"}[low]
    dense = fp8 if fp8_checkpoint or d.dense_format == "fp8" else "bfloat16"
    return {"gemm_quant_mode": dense, "moe_quant_mode": moe,
            "kvcache_quant_mode": "fp8" if d.kv_format == "fp8" else "bfloat16"}


def mesh_of(d) -> tuple[int, int, int, int]:
    """(tp, attention dp, moe tp, moe ep) as the engines run d (module doc)."""
    if d.attn_dp:
        return d.tp_size, d.attn_dp, d.expert_tp_size, d.ep_size
    G, R = max(d.tp_size, d.expert_tp_size), d.ep_size
    return (G, R, 1, R * G) if R > 1 else (G, 1, G, 1)


def peer_spec(d, concurrency: int, detail: dict, fp8_checkpoint: bool, engine: str) -> dict:
    """cli_estimate's keyword arguments for moetune's winner d at `concurrency` per replica."""
    q = quant_modes(d, fp8_checkpoint, engine)
    if not d.prefill_workers:
        tp, dp, mtp, mep = mesh_of(d)
        batch = max(1, math.ceil(concurrency / dp))
        budget = d.max_num_batched_tokens
        return {"mode": "agg", "batch_size": batch, "ctx_tokens": budget - batch if budget > batch else budget,
                "tp_size": tp, "attention_dp_size": dp, "moe_tp_size": mtp,
                "moe_ep_size": mep, **q}
    from moetune.search.cost.disagg import workers

    pre, dec = workers(d)
    dis = detail.get("disagg") or {}
    (ptp, pdp, pmtp, pmep), (dtp, ddp, dmtp, dmep) = mesh_of(pre), mesh_of(dec)
    return {"mode": "disagg", **q, "prefill_tp_size": ptp, "prefill_attention_dp_size": pdp,
            "prefill_moe_tp_size": pmtp, "prefill_moe_ep_size": pmep,
            "prefill_batch_size": int(dis.get("prefill_batch", 1)),
            "prefill_num_workers": d.prefill_workers * d.replicas, "decode_tp_size": dtp,
            "decode_attention_dp_size": ddp, "decode_moe_tp_size": dmtp, "decode_moe_ep_size": dmep,
            "decode_batch_size": int(dis.get("decode_batch", 1)), "decode_num_workers": d.decode_workers * d.replicas}


def launch_tokens(bs: int, engine: str, ctx_tokens: int) -> int:
    """max_num_batched_tokens of the peer's own launch for an aggregated worker of batch bs: vLLM's rule file
    (aiconfigurator/generator/rule_plugin/vllm.rule: max_batch_size raised to 512, or doubled from 512 on,
    then `agg max_num_tokens = max_batch_size + isl + 1500`); SGLang's sets no such budget: its ctx_tokens."""
    if engine != "vllm":
        return ctx_tokens
    return (512 if bs < 512 else 2 * bs) + ISL + 1500


def _mesh_knobs(tp: int, dp: int, mtp: int, mep: int) -> dict:
    if dp == mep and tp == mtp:  # DP = EP groups of TP ranks: the mesh simulate.py prices itself
        return dict(ep_size=mep, tp_size=tp, expert_tp_size=mtp)
    return dict(ep_size=mep, tp_size=tp, expert_tp_size=mtp, attn_dp=dp, moe_a2a=int(mtp == 1 and mep > 1))


def _formats(row: dict, side: str = "") -> dict:
    moe, gemm, kv = (str(row.get(f"{side}{k}", "")) for k in ("moe", "gemm", "kvcache"))
    low = LOW.get(moe, "none")
    return dict(quant_low_format=low, dense_format="fp8" if gemm.startswith("fp8") else "none",
                kv_format="fp8" if kv.startswith("fp8") else "none")


def deployment_of(row: dict, gpus: int, engine: str = "vllm"):
    """(moetune Deployment, concurrency per replica) of the peer's best row (module doc)."""
    from moetune.search.cost.deployment import Deployment

    if "(d)bs" not in row:
        tp, dp, mtp, mep = (int(row[k]) for k in ("tp", "dp", "moe_tp", "moe_ep"))
        bs = int(row["bs"])
        budget = launch_tokens(bs, engine, int(row.get("ctx_tokens") or ISL))
        d = Deployment(max_num_seqs=bs, max_num_batched_tokens=budget,
                       replicas=gpus // (tp * dp), cuda_graph_max_bs=bs, **_mesh_knobs(tp, dp, mtp, mep), **_formats(row))
        return d, bs * dp
    dec = _mesh_knobs(*(int(row[f"(d){k}"]) for k in ("tp", "dp", "moe_tp", "moe_ep")))
    ptp, pdp, pmtp, pmep = (int(row[f"(p){k}"]) for k in ("tp", "dp", "moe_tp", "moe_ep"))
    bs = int(row["(d)bs"])
    d = Deployment(max_num_seqs=bs, cuda_graph_max_bs=bs, prefill_workers=int(row["(p)workers"]),
                   decode_workers=int(row["(d)workers"]), prefill_ep=pmep, prefill_tp=ptp, prefill_expert_tp=pmtp,
                   prefill_tokens=max(1, int(row["(p)bs"])) * ISL, **dec, **_formats(row, "(d)"))
    return d, int(row["concurrency"])


def recipe_of(trace: str, config: str, hw: str, engine: str, d, tmp: Path, name: str = "peer_best") -> Path:
    """d's recipe on the scaled model's base, as a search winner's, written to tmp/NAME.yaml."""
    import yaml

    from moetune.search.study.optuna_study import Constraints, StudySettings
    from moetune.search.study.run import SearchSettings, winner_base
    from moetune.search.study.setup import Inputs, prepare
    from moetune.search.study.space import to_config

    scale = str(ROOT / "recipes/scale" / config)
    inputs = Inputs(trace, hw, scale_model=scale, input_len=ISL, output_len=OSL, engine=engine)
    st = StudySettings("x", f"sqlite:///{tmp / 'x.db'}", ("throughput_per_gpu",), "tpe", 1, 0, Constraints())
    setup = prepare(inputs)
    recipe = tmp / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump(to_config(winner_base(SearchSettings(inputs, st, tmp, "simulate"), setup),
                                               d).model_dump(), sort_keys=False))
    return recipe


def moetune_of_recipe(trace: str, config: str, hw: str, engine: str, d, concurrency: int, tmp: Path) -> dict:
    """`moetune simulate --recipe` of d's recipe (the scaled model's base, as a search winner's) at concurrency."""
    recipe = recipe_of(trace, config, hw, engine, d, tmp)
    scale = str(ROOT / "recipes/scale" / config)
    cmd = [sys.executable, "-m", "moetune", "simulate", "--trace", trace, "--recipe", str(recipe), "--hardware", hw,
           "--scale-model", scale, "--input-len", str(ISL), "--output-len", str(OSL), "--concurrency",
           str(concurrency), "--num-requests", str(max(3 * concurrency, 64)), "--engine", engine, "--json", "-"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(out.stdout)


def _fig(x: dict, tok: str, ttft: str, tpot: str) -> str:
    if "error" in x:
        return f"– ({x['error']})"
    return f"{x[tok]:,.0f} ({x[ttft]:.0f} / {x[tpot]:.1f})"


# --measured-only: moetune's search over what the tables hold — no hot fraction (a mixed-format expert op has no
# table entry), no int8 experts, EP sizes with fused-MoE rows (powers of two) — so its winner is priced from them
MEASURED = "quant_low_format: [none, fp8, int4]\nquant_hot_fraction: 0.0\nep_size: {eps}\n"


def measured_space(tmp: Path, gpus: int) -> Path:
    path = tmp / f"measured-{gpus}.yaml"
    path.write_text(MEASURED.format(eps=[e for e in (1, 2, 4, 8, 16) if e <= gpus]))
    return path


def cross_case(name: str, config: str, hw: str, trace: str, peer_python: str, engine: str, trials: int,
               tmp: Path, measured_only: bool = False) -> str:
    """One markdown row: moetune's winner on both, the peer's best on both, and the two ratios moetune / peer."""
    from bench_cluster_cases import run_case  # benchmarks/, beside this script

    from peer_compare import PEER_MODELS, peer_models

    gpus = int(hw.split("x")[0])
    models = peer_models(tmp / "models", peer_python)
    model_dir = str(models / PEER_MODELS[config])
    result, _ = run_case(trace, config, hw, 0, trials, tmp / f"out-{config}-{gpus}", engine=engine,
                         space_file=str(measured_space(tmp, gpus)) if measured_only else None)
    w = result.winner
    if w is None:
        ours = "no feasible trial | – | – "
        r1 = "–"
    else:
        m, d = w.metrics, w.deployment
        conc = int((m.get("detail", {}).get("load") or {}).get("concurrency") or 0)
        fp8_ckpt = config == "deepseek-v3.json"
        spec = peer_spec(d, conc, m.get("detail", {}), fp8_ckpt, engine)
        theirs = peer(peer_python, "agg", model_dir, "h200_sxm", engine, str(ISL), str(OSL), json.dumps(spec))
        share = m.get("detail", {}).get("measured_share")
        p50 = {k: (m.get("latency_ms", {}).get(k) or {}).get("p50", 0.0) for k in ("ttft", "tpot")}
        ours = (f"{d.label()} ({conc}) | {m['output_tok_s_per_gpu']:,.0f} ({p50['ttft']:.0f} / {p50['tpot']:.1f}), "
                f"{100 * (share or 0):.0f} % measured | {_fig(theirs, 'tok_s_gpu', 'ttft_ms', 'tpot_ms')} ")
        r1 = f"{m['output_tok_s_per_gpu'] / theirs['tok_s_gpu']:.2f}" if "error" not in theirs else "–"
    best = peer(peer_python, "best", model_dir, str(gpus), "h200_sxm", engine, str(ISL), str(OSL), str(TTFT), str(TPOT))
    if "error" in best or best["chosen"] not in best["rows"]:
        return f"| {name} {gpus}×H200 | {ours}| {r1} | peer: {best.get('error', 'no best row')} | – | – | – |"
    row = best["rows"][best["chosen"]]
    pd_, conc = deployment_of(row, gpus, engine)
    back = moetune_of_recipe(trace, config, hw, engine, pd_, conc, tmp)
    if "error" not in back:
        back["ttft_p50"] = back["latency_ms"]["ttft"]["p50"]
        back["tpot_p50"] = back["latency_ms"]["tpot"]["p50"]
    peer_fig = f"{row['tokens/s/gpu']:,.0f} ({row['ttft']:.0f} / {row['tpot']:.1f})"
    r2 = f"{back['output_tok_s_per_gpu'] / row['tokens/s/gpu']:.2f}" if "error" not in back else "–"
    share = (back.get("detail") or {}).get("measured_share") if "error" not in back else None
    mine = _fig(back, "output_tok_s_per_gpu", "ttft_p50", "tpot_p50") + (
        f", {100 * share:.0f} % measured" if share is not None else "")
    return (f"| {name} {gpus}×H200 | {ours}| {r1} | {best['chosen']}: {pd_.label()} ({conc}) | {peer_fig} | {mine} | "
            f"{r2} |")


HEADER = ["| case | moetune winner (concurrency / replica) | moetune: tok/s/GPU (TTFT / TPOT P50 ms), measured share | "
          "peer prices it: tok/s/GPU (TTFT / TPOT ms) | moetune / peer | peer's best (concurrency / replica) | "
          "peer: tok/s/GPU (TTFT / TPOT ms) | moetune prices it (simulate --recipe) | moetune / peer |",
          "|---|---|---|---|---|---|---|---|---|"]


def cross_table(trace: str, cases: list, peer_python: str, engine: str, trials: int, tmp: Path,
                measured_only: bool = False) -> list[str]:
    """The table (markdown lines) over the cases; measured_only: moetune's searches over `MEASURED`."""
    lines = list(HEADER)
    print("\n" + "\n".join(lines), flush=True)
    for name, config, hw in cases:
        lines.append(cross_case(name, config, hw, trace, peer_python, engine, trials, tmp, measured_only))
        print(lines[-1], flush=True)
    return lines

