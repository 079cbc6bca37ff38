"""The 1-GPU replica beside AIConfigurator (`bench_cluster_cases.py --peer PYTHON --one-gpu`): the shape the
README's cluster commands pick for Mixtral-8x7B and Qwen3-30B-A3B (8 replicas × 1 GPU), TP 1 / EP 1, bf16,
input 1,024 / output 256, balanced routing, the same engine tables on both sides.

Two tables. The static batch at 1, 32, 128, 256, 384, 512 (`peer_compare.peer_table` on the 1-GPU mesh). And
the steady state at 384 and 512 in flight with `max_num_batched_tokens` 2,048 (the peer's Qwen3 pick):

- the peer: `cli_estimate(mode="agg", ctx_tokens=2048)` — every step of a request's first ceil(isl·b/ctx)
  outputs is one *mixed step* (ctx prompt tokens + b − ctx/isl decode rows), the rest decode-only steps at b;
  TPOT the mean over the output. Its ops per step come back (`peer_aiconfigurator.py ... CTX`).
- moetune: the same mixed step priced alone (ctx/isl fresh prompts beside the decode rows at KV isl + osl/2,
  the peer's), the same decode-only step (a static batch of b, `peer_compare.moetune_estimate`), and its own
  steady state: a staggered closed loop of b in flight (3b requests), whose TPOT P50 and tok/s/GPU are
  moetune's answer (the steps carry what the scheduler gives them, not one fixed mixed step).

Columns (ms, moetune / peer): the mixed step by op group (GROUPS), the decode-only step, the steady TPOT
and tok/s/GPU. Every figure is an estimate.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from peer_compare import GROUPS, PEER_MODELS, ROOT, grouped, moetune_estimate, peer_models

ISL, OSL = 1024, 256
FP8_DENSE_KV = dict(dense_format="fp8", kv_format="fp8")
# per case: (in flight, max_num_batched_tokens, formats) — the peer's Qwen3 pick (384, 2,048, bf16) and the
# README winners' shapes (Qwen3: 512 in flight, 16,384, fp8 KV; Mixtral: bf16 experts with fp8 dense / KV)
STEADY = {"mixtral-8x7b.json": [(256, 2048, FP8_DENSE_KV), (384, 2048, FP8_DENSE_KV)],
          "qwen3-30b-a3b.json": [(384, 2048, {}), (512, 2048, {}), (512, 16384, dict(kv_format="fp8"))]}
ONE_GPU = dict(ep_size=1, tp_size=1, expert_tp_size=1)


def peer_quant(formats: dict) -> dict:
    """cli_estimate's quant keywords for moetune's formats (bf16 experts)."""
    return {"gemm_quant_mode": "fp8" if formats.get("dense_format") == "fp8" else "bfloat16",
            "kvcache_quant_mode": "fp8" if formats.get("kv_format") == "fp8" else "bfloat16",
            "moe_quant_mode": "bfloat16"}


def peer_agg(peer_python: str, model_dir: Path, engine: str, version: str | None, batch: int, ctx: int,
             formats: dict) -> dict:
    out = subprocess.run([peer_python, str(ROOT / "benchmarks/peer_aiconfigurator.py"), str(model_dir), "h200_sxm",
                          engine, version or "", str(ISL), str(OSL), str(batch), "1", "1", "1", "1", "balanced",
                          str(ctx), json.dumps(peer_quant(formats))], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def mixed_step(setup, d, prompts: int, decode: int, kv: int) -> dict[str, float]:
    """moetune's phases (ms) of one step: `prompts` fresh prompts of ISL beside `decode` rows at KV `kv`."""
    from moetune.search.cost.schedule import Schedule

    P = prompts * ISL
    one = lambda x: np.array([[x]], dtype=np.int64)  # noqa: E731  [S=1, R=1]
    none = np.zeros(0, dtype=np.int64)
    s = Schedule(one(P), one(decode), one(prompts * ISL * (ISL + 1) // 2 + decode * kv), one(P + decode * kv),
                 one(decode + prompts), one(decode + prompts), none, none, None, one(decode + prompts), one(0))
    step, phases, _ = setup.sim.price_schedule(d, s)
    return {**{k: 1e3 * float(np.sum(v)) for k, v in phases.items()}, "step": 1e3 * float(step.sum())}


def steady(trace: str, config: str, hw: str, batch: int, ctx: int, formats: dict, engine: str,
           version: str | None):
    """(setup, deployment, moetune's staggered closed loop at `batch` in flight: its Metrics)."""
    from moetune.search.cost.deployment import Deployment
    from moetune.search.study.setup import Inputs, prepare

    setup = prepare(Inputs(trace, hw, scale_model=str(ROOT / "recipes/scale" / config), scale_routing="balanced",
                           input_len=ISL, output_len=OSL, num_requests=3 * batch, concurrency=batch, engine=engine,
                           engine_version=version))
    d = Deployment(max_num_seqs=batch, max_num_batched_tokens=ctx, cuda_graph_max_bs=batch, replicas=8, **ONE_GPU,
                   **formats)
    return setup, d, setup.sim.evaluate(d, setup.workload)


def _ops(ours: dict, theirs: dict) -> str:
    a, b = grouped(ours), grouped(theirs)
    return "; ".join(f"{g} {a[g]:.2f}/{b[g]:.2f}" for g in GROUPS if a[g] or b[g])


def _vs(ours: float, theirs: float, fmt: str = ".2f") -> str:
    return f"{ours:{fmt}} / {theirs:{fmt}} ({ours / theirs:.2f})" if theirs else f"{ours:{fmt}} / –"


def steady_row(name: str, trace: str, config: str, hw: str, batch: int, ctx: int, formats: dict, peer: dict,
               engine: str, version: str | None) -> str:
    setup, d, m = steady(trace, config, hw, batch, ctx, formats, engine, version)
    sched = peer.get("scheduling") or {}
    prompts = int(sched.get("mix_context_tokens", ctx)) // ISL
    gen = int(sched.get("mix_decode_requests", batch - prompts))
    mix = mixed_step(setup, d, prompts, gen, ISL + OSL // 2)
    peer_mix, peer_dec = (sum(float(v) for v in peer.get(k, {}).values()) for k in ("mix_ops_ms", "genonly_ops_ms"))
    dec = moetune_estimate(trace, config, hw, dict(ONE_GPU, replicas=8, **formats), batch, engine, version)["step_ms"]
    tpot = (m.latency_ms.get("tpot") or {}).get("p50", m.tpot_ms)
    fmt = ", ".join(f"{k.split('_')[0]} {v}" for k, v in formats.items()) or "bf16"
    return (f"| {name} | {batch}, tok {ctx}, {fmt} | {int(sched.get('num_mix_steps', 0))} mixed ({prompts * ISL} + "
            f"{gen} rows) + {int(sched.get('num_genonly_steps', 0))} decode-only | {_vs(mix['step'], peer_mix)} | "
            f"{_ops(mix, peer.get('mix_ops_ms', {}))} | {_vs(dec, peer_dec)} | {_vs(tpot, peer['tpot_ms'], '.1f')} | "
            f"{_vs(m.output_tok_s_per_gpu, peer['tok_s_gpu'], ',.0f')} | "
            f"{100 * m.detail.get('measured_share', 0.0):.0f} % |")


STEADY_HEADER = ["| case | in flight, max_num_batched_tokens, formats | the peer's steps a request spans | mixed step ms, "
                 "moetune / peer (ratio) | mixed step by op group, ms moetune/peer | decode-only step ms | steady TPOT "
                 "ms (moetune P50 / peer) | tok/s/GPU | measured share |", "|---|---|---|---|---|---|---|---|---|"]


def steady_table(trace: str, cases: list, peer_python: str, engine: str, version: str | None, tmp: Path) -> list[str]:
    """The steady-state table (markdown lines) over the cases that fit one GPU (STEADY)."""
    models = peer_models(tmp, peer_python)
    lines = list(STEADY_HEADER)
    print("\n" + "\n".join(lines), flush=True)
    for name, config, hw in cases:
        for b, ctx, formats in STEADY.get(config, []):
            peer = peer_agg(peer_python, models / PEER_MODELS[config], engine, version, b, ctx, formats)
            if "error" in peer:
                lines.append(f"| {name} | {b}, tok {ctx} | peer: {peer['error']} | | | | | | |")
            else:
                lines.append(steady_row(name, trace, config, hw, b, ctx, formats, peer, engine, version))
            print(lines[-1], flush=True)
    return lines
