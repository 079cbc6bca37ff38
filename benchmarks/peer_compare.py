"""moetune's estimate beside AIConfigurator's own (`bench_cluster_cases.py --peer PYTHON`): the four
cluster cases at fixed configurations — TP-8 (tensor-parallel attention and experts), and EP over
every GPU with data-parallel attention (EP-8, DeepSeek-V3 on 16 GPUs EP-16) — at batch 1, 32, 128,
256 per attention rank (a TP group's batch; each DP rank's), input 1,024 / output 256, routing
`--scale-routing balanced` (every expert equally loaded: the peer prices `balanced` MoE tables).

Both sides run a static batch: moetune a burst of batch × attention ranks requests with
`max_num_seqs` = batch and `max_num_batched_tokens` = batch × 1,024 (the whole prompt batch in one
step), decode steps replayed from a CUDA graph; AIConfigurator `cli_estimate(mode="static")` with
the same engine tables (run in its own venv: benchmarks/peer_aiconfigurator.py). Columns: the decode
step (moetune's mean decode step; the peer's TPOT), TTFT, TPOT and output tok/s per GPU of each,
and moetune / peer. Where TPOT or tok/s/GPU differ by more than 15 %, the decode step op by op (ms,
moetune / peer): attention (projections, kernel, norms), MoE (router, experts, shared and dense
MLPs), comm (dispatch / combine, TP all-reduces) and other (LM head, embedding, the engine's calls).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_MODELS = {"mixtral-8x7b.json": "mistralai--Mixtral-8x7B-v0.1", "qwen3-30b-a3b.json": "Qwen--Qwen3-30B-A3B",
               "deepseek-v3.json": "deepseek-ai--DeepSeek-V3"}
BATCHES = (1, 32, 128, 256)
ONE_GPU_BATCHES = (1, 32, 128, 256, 384, 512)  # --one-gpu: up to the steady state's loads (peer_steady.py)
GROUPS = ("attention", "moe", "comm", "other")


def meshes(gpus: int, one_gpu: bool = False) -> dict[str, tuple[dict, tuple[int, int, int, int]]]:
    """name → (moetune Deployment knobs, the peer's (tp, attention dp, moe tp, moe ep)); one_gpu: the 1-GPU
    replica alone (TP 1 / EP 1, `gpus` replicas)."""
    if one_gpu:
        return {f"1 GPU ({gpus} replicas)": (dict(ep_size=1, tp_size=1, expert_tp_size=1, replicas=gpus), (1, 1, 1, 1))}
    return {"TP-8": (dict(ep_size=1, tp_size=8, expert_tp_size=8, replicas=gpus // 8), (8, 1, 8, 1)),
            f"EP-{gpus} DP attention": (dict(ep_size=gpus), (1, gpus, 1, gpus))}


def peer_models(tmp: Path, peer_python: str) -> Path:
    """The peer's own cached config.json of each model, copied to MODEL_DIR/config.json (its CLI reads a
    local directory; the cache is the package's model_configs)."""
    where = subprocess.run([peer_python, "-c", "import aiconfigurator_core, pathlib; "
                            "print(pathlib.Path(aiconfigurator_core.__file__).parent / 'model_configs')"],
                           capture_output=True, text=True, check=True).stdout.strip()
    for name in PEER_MODELS.values():
        (tmp / name).mkdir(parents=True, exist_ok=True)
        (tmp / name / "config.json").write_text((Path(where) / f"{name}_config.json").read_text())
    return tmp


def peer_estimate(peer_python: str, model_dir: Path, engine: str, version: str | None, batch: int,
                  mesh: tuple[int, int, int, int]) -> dict | None:
    tp, dp, moe_tp, moe_ep = mesh
    out = subprocess.run([peer_python, str(ROOT / "benchmarks/peer_aiconfigurator.py"), str(model_dir), "h200_sxm",
                          engine, version or "", "1024", "256", str(batch), str(tp), str(dp), str(moe_tp), str(moe_ep)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def group_of(op: str) -> str:
    """A phase (moetune) or op name (the peer's) → its GROUPS entry."""
    name = op.lower()
    if any(w in name for w in ("dispatch", "combine", "_ar", "allreduce", "all_reduce", "tp_", "reduce_scatter",
                               "all_gather", "p2p")):
        return "comm"
    if any(w in name for w in ("router", "moe", "expert", "mlp", "ffn", "permute")):
        return "moe"
    if any(w in name for w in ("attention", "qkv", "proj", "mla", "bmm", "norm", "rope", "q_", "kv_")):
        return "attention"
    return "other"


def grouped(ops: dict) -> dict[str, float]:
    out = dict.fromkeys(GROUPS, 0.0)
    for k, v in ops.items():
        if k not in ("step", "steps", "straggler_wait", "offload_wait"):
            out[group_of(k)] += float(v)
    return out


def moetune_estimate(trace: str, config: str, hardware: str, knobs: dict, batch: int, engine: str,
                     version: str | None) -> dict:
    from moetune.search.cost.deployment import Deployment
    from moetune.search.cost.schedule import SimWorkload
    from moetune.search.study.setup import Inputs, prepare

    setup = prepare(Inputs(trace, hardware, scale_model=str(ROOT / "recipes/scale" / config), scale_routing="balanced",
                           input_len=1024, output_len=256, num_requests=1, engine=engine, engine_version=version))
    d = Deployment(max_num_seqs=batch, max_num_batched_tokens=batch * 1024, cuda_graph_max_bs=batch, **knobs)
    n = batch * d.ep_size * d.replicas
    m = setup.sim.evaluate(d, SimWorkload((1024,) * n, 256))
    dec = m.phases_ms.get("decode", {})
    return {"phases": dec, "step_ms": dec.get("step", 0.0), "ttft_ms": (m.latency_ms.get("ttft") or {}).get("p50", m.ttft_ms),
            "tpot_ms": m.tpot_ms, "tok_s_gpu": m.output_tok_s_per_gpu, "ops": grouped(dec),
            "share": m.detail.get("measured_share", 0.0), "source": m.detail.get("cost_source", ""),
            "fits": setup.sim.memory_reason(d) is None}


def gap_note(ours: dict, peer: dict) -> str:
    """The decode step by op group, ms moetune / peer, where the two differ by more than 0.05 ms."""
    theirs = grouped(peer.get("decode_ops_ms") or {})
    parts = [f"{g} {ours['ops'][g]:.2f}/{theirs[g]:.2f}" for g in GROUPS if abs(ours["ops"][g] - theirs[g]) > 0.05]
    return "; ".join(parts)


def peer_table(trace: str, cases: list, peer_python: str, engine: str, version: str | None, tmp: Path,
               one_gpu: bool = False) -> list[str]:
    """Print the comparison table (markdown) for the cases (name, config, hardware); returns its lines.
    one_gpu: the 1-GPU replica at ONE_GPU_BATCHES instead of the TP-8 / EP meshes."""
    models = peer_models(tmp, peer_python)
    lines = ["| case | mesh | batch | decode step ms (moetune / peer) | TTFT ms | TPOT ms | tok/s/GPU | TPOT ratio | "
             "tok/s/GPU ratio | measured share | gap > 15 %: decode ms by op group (moetune/peer) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n" + "\n".join(lines))
    for name, config, hw in cases:
        gpus = int(hw.split("x")[0])
        for mesh, (knobs, peer_mesh) in meshes(gpus, one_gpu).items():
            for b in ONE_GPU_BATCHES if one_gpu else BATCHES:
                ours = moetune_estimate(trace, config, hw, knobs, b, engine, version)
                peer = peer_estimate(peer_python, models / PEER_MODELS[config], engine, version, b, peer_mesh)
                lines.append(row(f"{name} {gpus}×H200", mesh, b, ours, peer))
                print(lines[-1], flush=True)
    return lines


def row(case: str, mesh: str, b: int, ours: dict, peer: dict | None) -> str:
    fits = "" if ours["fits"] else " (over memory)"
    if not peer or "error" in peer:
        return (f"| {case} | {mesh} | {b} | {ours['step_ms']:.2f} / – | {ours['ttft_ms']:.0f} / – | "
                f"{ours['tpot_ms']:.2f} / – | {ours['tok_s_gpu']:,.0f} / – | – | – | {100 * ours['share']:.0f} % | "
                f"peer: {(peer or {}).get('error', 'no estimate')}{fits} |")
    tpot_r, tok_r = ours["tpot_ms"] / peer["tpot_ms"], ours["tok_s_gpu"] / peer["tok_s_gpu"]
    note = gap_note(ours, peer) if max(abs(tpot_r - 1), abs(tok_r - 1)) > 0.15 else ""
    oom = " (peer: OOM)" if peer.get("oom") else ""
    return (f"| {case} | {mesh} | {b} | {ours['step_ms']:.2f} / {peer['tpot_ms']:.2f} | {ours['ttft_ms']:.0f} / "
            f"{peer['ttft_ms']:.0f} | {ours['tpot_ms']:.2f} / {peer['tpot_ms']:.2f} | {ours['tok_s_gpu']:,.0f} / "
            f"{peer['tok_s_gpu']:,.0f} | {tpot_r:.2f} | {tok_r:.2f} | {100 * ours['share']:.0f} % | "
            f"{note}{fits}{oom} |")
