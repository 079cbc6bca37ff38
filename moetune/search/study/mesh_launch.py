"""The engines' flags for a general mesh (cost/mesh.py: attention DP a × TP t, experts EP e × TP f over
N = a·t = e·f GPUs), each checked against the engines' parsers (flag_tables/*.json):

| mesh | vLLM | SGLang |
|---|---|---|
| attention | `--tensor-parallel-size t`, `--data-parallel-size a` | `--tp-size N`, `--attn-dp-size a` (a > 1; models with DP attention) |
| experts EP N (f = 1) | `--enable-expert-parallel` | `--ep-size N` |
| experts TP N (e = 1) | (no flag: vLLM shards experts by TP over t·a) | (no flag: MoE TP = N / ep_size = N) |
| experts EP e × TP f (both > 1) | none: vLLM's experts are all-EP or all-TP over N (re-priced EP N) | `--ep-size e` (MoE TP = N / e) |
| moe_a2a 1 (all-to-all) | `--all2all-backend deepep_low_latency` (one node) / `deepep_high_throughput` (across nodes) | `--moe-a2a-backend deepep` |
| moe_a2a 0 (all-gather + reduce-scatter) | `--all2all-backend allgather_reducescatter` | `--moe-a2a-backend none` |
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from moetune.search.cost.deployment import Deployment


@dataclass
class MeshFlags:
    flags: list[str]
    notes: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    as_run: Deployment | None = None  # the mesh the engine runs where it differs (None: as priced)


def vllm_mesh(d: Deployment, multi_node: bool) -> MeshFlags:
    a, t, e, f = d.attn_dp, d.tp_size, d.ep_size, d.expert_tp_size
    N = e * f
    out = MeshFlags(["--tensor-parallel-size", str(t)] + (["--data-parallel-size", str(a)] if a > 1 else []))
    if e > 1 and f > 1:
        out.unsupported.append(f"experts EP {e} × TP {f}: vLLM's experts are all expert-parallel or all "
                               f"tensor-parallel over the {N} GPUs (re-priced EP {N})")
        out.as_run = replace(d, ep_size=N, expert_tp_size=1)
        e = N
    if e > 1:
        a2a = d.moe_a2a
        backend = ("deepep_high_throughput" if multi_node else "deepep_low_latency") if a2a else "allgather_reducescatter"
        out.flags += ["--enable-expert-parallel", "--all2all-backend", backend]
    else:
        out.notes.append(f"experts tensor-parallel over the {N} GPUs (vLLM's default without --enable-expert-parallel)")
    return out


def sglang_mesh(d: Deployment, dp_attention_ok: bool, model_type: str) -> MeshFlags:
    a, e, f = d.attn_dp, d.ep_size, d.expert_tp_size
    N = e * f
    out = MeshFlags(["--tp-size", str(N)] if N > 1 else [])
    if a > 1:
        if dp_attention_ok:
            out.flags += ["--attn-dp-size", str(a)]
        else:
            out.unsupported.append(f"attention DP {a}: SGLang has no attention-DP groups for {model_type} "
                                   f"(attention runs TP over {N}; re-priced so)")
            out.as_run = replace(d, attn_dp=1, tp_size=N)
    if e > 1:
        out.flags += ["--ep-size", str(e), "--moe-a2a-backend", "deepep" if d.moe_a2a else "none"]
        if f > 1:
            out.notes.append(f"MoE TP {f} = --tp-size {N} / --ep-size {e} (SGLang's moe_tp_size)")
    return out
