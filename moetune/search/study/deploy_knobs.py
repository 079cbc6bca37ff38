"""The search space's mesh and disaggregation knobs (cost/mesh.py, cost/disagg.py): their rows of
the knob table, the points they make equivalent (one canonical point each), the pairs no engine
runs, and their place in a recipe (the `deploy` section, config.DeployConfig).

| knob | recipe key | domain | canonical / pruned |
|---|---|---|---|
| attn_dp | deploy.attn_dp | 0 (the `parallel` mesh), 1, 2, 4, … up to the GPUs | attention TP = ep_size · expert_tp_size / attn_dp (tp_size follows it); a mesh the `parallel` one prices (DP = EP groups of TP = expert TP ranks, all-to-all) → 0; pruned when attn_dp does not divide the GPUs, or a TP split does not divide the heads / intermediate sizes |
| moe_a2a | deploy.moe_a2a | 0 (all-gather + reduce-scatter), 1 (all-to-all) | moot at attn_dp 0 (→ 1) and at ep_size 1 (→ 0); pruned: all-to-all with expert TP > 1 (the engines' all-to-all backends run pure EP) |
| prefill_workers | deploy.prefill_workers | 0 (aggregated), 1, 2, 4 | 0: every prefill_* knob and decode_workers moot (→ neutral); pruned when replicas × (P·N_p + D·N_d) exceeds the GPUs (a replica: P prefill + D decode workers) |
| decode_workers | deploy.decode_workers | 1, 2, 4 | — |
| prefill_ep | deploy.prefill_ep_size | 1, 2, 4, … up to the GPUs | — |
| prefill_tp | deploy.prefill_tp_size | 1, 2, 4, 8 | pruned when it does not divide the prefill worker's GPUs |
| prefill_expert_tp | deploy.prefill_expert_tp_size | 1, 2, 4, 8 | — |
| prefill_tokens | deploy.prefill_max_num_batched_tokens | 1024, 2048, 4096, 8192, 16384 | — |

Searched on priced (simulated GPU) searches, never on this-machine (moetune's CPU engine runs
neither: `deploy_reason`): the mesh knobs attn_dp and moe_a2a (with the parallel section's expert_tp_size,
space.py) unnamed on hardware of 2 GPUs or more (the meshes the engines run: DP attention with TP or EP
experts; a sampled attn_dp that does not divide the experts' GPUs, or an all-to-all under expert TP, is
repaired to the nearest mesh that runs, `repair_mesh`, rather than pruned); prefill_tokens when --space
names it; prefill_workers, decode_workers, prefill_ep, prefill_tp and prefill_expert_tp also unnamed on 16
GPUs or more (`default_searched`: without prefill_expert_tp a prefill worker could only be EP × attention TP,
never the DP-attention × TP-experts mesh the measured tables favour for DeepSeek-V3's prefill). Not searched: the base recipe's
value (its `deploy` section), left out of the grid where that is the neutral one.
"""

from __future__ import annotations

import math
from dataclasses import replace

from moetune.search.cost.deployment import Deployment, gpus
from moetune.search.cost.disagg import disagg_reason, total_gpus, workers
from moetune.search.cost.mesh import mesh_reason

DEPLOY_KNOBS = ("attn_dp", "moe_a2a", "prefill_workers", "decode_workers", "prefill_ep", "prefill_tp",
                "prefill_expert_tp", "prefill_tokens")
DISAGG_DEFAULT = ("prefill_workers", "decode_workers", "prefill_ep", "prefill_tp", "prefill_expert_tp")  # searched
# unnamed on 2+ nodes
MESH_DEFAULT = ("attn_dp", "moe_a2a")  # searched unnamed on 2+ GPUs (with expert_tp_size: space.py)
MULTI_NODE_GPUS = 16  # two nodes of 8 GPUs (every built-in hardware's node)
DISAGG_NEUTRAL = dict(decode_workers=1, prefill_ep=1, prefill_tp=1, prefill_expert_tp=1, prefill_tokens=8192)


def deploy_rows(max_ranks: int) -> list[tuple[str, str, tuple, str]]:
    """(name, recipe key, values, what) of each knob (space.Knob's fields)."""
    pow2 = tuple(g for g in (1, 2, 4, 8, 16, 32, 64) if g <= max(max_ranks, 1))
    return [
        ("attn_dp", "deploy.attn_dp", (0, *pow2), "attention data-parallel groups (0: the parallel mesh)"),
        ("moe_a2a", "deploy.moe_a2a", (0, 1), "experts reached by all-to-all (1) or all-gather + reduce-scatter (0)"),
        ("prefill_workers", "deploy.prefill_workers", tuple(p for p in (0, 1, 2, 4) if p < max(max_ranks, 2)),
         "disaggregated prefill workers (0: aggregated serving)"),
        ("decode_workers", "deploy.decode_workers", tuple(p for p in (1, 2, 4) if p < max(max_ranks, 2)),
         "disaggregated decode workers"),
        ("prefill_ep", "deploy.prefill_ep_size", pow2, "a prefill worker's expert-parallel ranks"),
        ("prefill_tp", "deploy.prefill_tp_size", tuple(g for g in pow2 if g <= 8), "a prefill worker's attention TP"),
        ("prefill_expert_tp", "deploy.prefill_expert_tp_size", tuple(g for g in pow2 if g <= 8),
         "a prefill worker's expert TP"),
        ("prefill_tokens", "deploy.prefill_max_num_batched_tokens", (1024, 2048, 4096, 8192, 16384),
         "a prefill worker's tokens per step"),
    ]


def default_searched(name: str, max_ranks: int) -> bool:
    """Whether a knob of this table is searched when --space does not name it: the mesh knobs on two GPUs
    or more, the disaggregated form's main knobs on two nodes or more (where the engines serve it); else
    only when named (the base recipe's value otherwise), so that a small budget is not spread thin."""
    return (name in DISAGG_DEFAULT and max_ranks >= MULTI_NODE_GPUS) or (name in MESH_DEFAULT and max_ranks > 1)


def repair_mesh(d: Deployment, gpus: int, notes: list[str], meshes: bool = False) -> tuple[Deployment, list[str]]:
    """A mesh as the nearest one that runs: (meshes) expert TP narrowed (halved) until EP × expert TP fits the GPUs;
    where the space searches meshes (`meshes`: a GPU search), the `parallel` mesh with attention TP 1 under
    expert TP > 1 (attention replicated over each TP group: no serving engine runs it) as DP attention
    over all N = EP × expert-TP GPUs; then, for a general mesh, attention DP dividing N (gcd(attn_dp, N))
    with attention TP N / attn_dp, and all-gather dispatch under expert TP (the engines' all-to-all
    backends run pure EP), every expert resident. A point already over the GPUs at expert TP 1 is left
    to be pruned."""
    out = d
    while meshes and out.expert_tp_size > 1 and out.ep_size * max(out.expert_tp_size, 1 if out.attn_dp else out.tp_size) > gpus:
        out = replace(out, expert_tp_size=out.expert_tp_size // 2)
    if out.expert_tp_size != d.expert_tp_size:
        notes.append(f"expert_tp_size {d.expert_tp_size} → {out.expert_tp_size} (EP {d.ep_size} × expert TP fits "
                     f"the {gpus} GPUs)")
    if meshes and not out.attn_dp and out.tp_size == 1 < out.expert_tp_size:
        out = replace(out, attn_dp=out.ep_size * out.expert_tp_size)
        notes.append(f"attention TP 1 under expert TP {out.expert_tp_size} → attention DP {out.attn_dp} (no engine "
                     "replicates attention over a TP group)")
    if not out.attn_dp:
        return out, notes
    if out.offload_resident_fraction < 1:  # a general mesh is priced with every expert resident (mesh.py)
        out = replace(out, offload_resident_fraction=1.0, offload_prefetch_depth=0, offload_eviction="lru")
        notes.append("offloading under a general mesh → every expert resident")
    N = out.ep_size * out.expert_tp_size
    if N % out.attn_dp:
        out = replace(out, attn_dp=math.gcd(out.attn_dp, N))
        notes.append(f"attn_dp {d.attn_dp} → {out.attn_dp} (it divides the {N} GPUs of experts EP {out.ep_size} × "
                     f"TP {out.expert_tp_size})")
    t = N // out.attn_dp  # attention TP: attention DP × TP covers the experts' GPUs
    if t not in (1, max(t, out.expert_tp_size)) or out.expert_tp_size not in (1, max(t, out.expert_tp_size)):
        notes.append(f"attention DP {out.attn_dp} × TP {t} beside expert TP {out.expert_tp_size} → attention DP {N} "
                     "(a recipe's parallel section holds attention TP 1 or the expert-TP group: config.ParallelConfig)")
        out, t = replace(out, attn_dp=N), 1
    if out.tp_size != t:
        out = replace(out, tp_size=t)
    if out.moe_a2a and out.expert_tp_size > 1:
        out = replace(out, moe_a2a=0)
        notes.append(f"moe_a2a 1 → 0 (an all-to-all runs pure EP; expert TP {out.expert_tp_size} is all-gathered)")
    return out, notes


def canonical_deploy(d: Deployment, notes: list[str]) -> tuple[Deployment, list[str]]:
    """d with its moot mesh / disaggregation knobs at one value (module doc), and why."""
    out = d
    if not d.attn_dp and not d.moe_a2a:
        out = replace(out, moe_a2a=1)
        notes.append("attn_dp 0: the parallel mesh dispatches by all-to-all (moe_a2a moot)")
    if d.attn_dp:
        N = d.ep_size * d.expert_tp_size
        if N % d.attn_dp == 0 and d.tp_size != N // d.attn_dp:
            out = replace(out, tp_size=N // d.attn_dp)
            notes.append(f"attention DP {d.attn_dp} over {N} GPUs: attention TP {N // d.attn_dp}")
        if out.ep_size == 1 and out.moe_a2a:
            out = replace(out, moe_a2a=0)
            notes.append("ep_size 1: no all-to-all (moe_a2a moot)")
        if out.overlap and not (out.moe_a2a and out.ep_size > 1):
            out = replace(out, overlap=0)
            notes.append("two-batch overlap hides an all-to-all: none under all-gather (overlap moot)")
        if out.attn_dp == out.ep_size and out.tp_size == out.expert_tp_size and (out.ep_size == 1 or out.moe_a2a):
            out = replace(out, attn_dp=0, moe_a2a=1)
            notes.append("attention DP = EP groups of TP = expert-TP ranks: the parallel mesh (attn_dp 0)")
    if not d.prefill_workers and any(getattr(d, k) != v for k, v in DISAGG_NEUTRAL.items()):
        out = replace(out, **DISAGG_NEUTRAL)
        notes.append("aggregated serving: the prefill / decode worker knobs are moot")
    return out, notes


def repair_workers(d: Deployment, gpus: int, notes: list[str]) -> tuple[Deployment, list[str]]:
    """A disaggregated point as the nearest one that runs: the prefill attention TP dividing the prefill
    worker's GPUs, then fewer prefill workers, decode workers, prefill EP ranks and prefill expert-TP ranks
    (halved in that order) until one replica's workers fit the GPUs; then, where one of each is still over
    (a decode worker as wide as the GPUs), the decode worker's EP halved (its mesh repaired again: attention
    DP dividing its GPUs). Other points unchanged."""
    if not d.prefill_workers:
        return d, notes
    out, N_p = d, d.prefill_ep * d.prefill_expert_tp
    if N_p % d.prefill_tp:
        out = replace(out, prefill_tp=math.gcd(d.prefill_tp, N_p))
        notes.append(f"prefill_tp {d.prefill_tp} → {out.prefill_tp} (it divides the prefill worker's {N_p} GPUs)")
    knobs = ("prefill_workers", "decode_workers", "prefill_ep", "prefill_expert_tp", "ep_size")
    before = tuple(getattr(out, k) for k in knobs)
    while total_gpus(out) > gpus:
        knob = next((k for k in knobs if getattr(out, k) > 1), None)
        if knob is None:
            break  # one GPU a worker does not fit: pruned
        out = replace(out, **{knob: getattr(out, knob) // 2})
        if knob == "ep_size":  # the decode worker's mesh: attention DP dividing its GPUs again
            out, notes = repair_mesh(out, gpus, notes)
        if out.prefill_tp > out.prefill_ep * out.prefill_expert_tp:
            out = replace(out, prefill_tp=out.prefill_ep * out.prefill_expert_tp)
    after = tuple(getattr(out, k) for k in knobs)
    if after != before:
        notes.append(f"prefill workers, decode workers, prefill EP, prefill expert TP, decode EP {before} → {after} "
                     f"(they fit the {gpus} GPUs)")
    return out, notes


def prune_deploy(d: Deployment, model, max_ranks: int) -> str | None:
    """Why no engine runs this mesh / disaggregated form (module doc), or None. model: the SimModel or None."""
    if d.prefill_workers:
        reason = disagg_reason(d, max_ranks) or _prefill_tiles(model, d)
        if reason:
            return reason
        return next((r for r in (_mesh_split(model, w) for w in workers(d)) if r), None)
    if d.attn_dp and gpus(d) > max_ranks:
        return f"{gpus(d)} GPUs for experts EP {d.ep_size} × TP {d.expert_tp_size}; the hardware has {max_ranks}"
    return _mesh_split(model, d)


def _prefill_tiles(model, d: Deployment) -> str | None:
    if model is not None and model.E % d.prefill_ep:
        return f"prefill_ep {d.prefill_ep} does not divide the {model.E} experts (a prefill worker has no redundant slots)"
    return None


def _mesh_split(model, d: Deployment) -> str | None:
    if model is None:
        return None
    return mesh_reason(model, d, None)


def deploy_reason(sim, d: Deployment, w) -> str | None:
    """Why the simulator does not price d's mesh / disaggregated form on its hardware and workload, or None."""
    m, hw = sim.src.model, sim.hw
    if d.prefill_workers:
        if hw.name == "this-machine":
            return "disaggregated prefill/decode is priced for GPU serving engines (moetune's CPU engine runs neither)"
        return disagg_reason(d, hw.max_ranks) or _prefill_tiles(m, d) or next(
            (r for r in (mesh_reason(m, x, hw) for x in workers(d)) if r), None)
    return mesh_reason(m, d, hw, w)


def deploy_section(d: Deployment, knobs) -> dict | None:
    """The recipe's `deploy` section of d (None where every knob it holds is neutral). knobs: space.Knob rows."""
    neutral = Deployment()
    values = d.as_dict()
    out = {}
    for k in knobs:
        section, _, name = k.key.partition(".")
        if section == "deploy":
            v = values[k.name]
            if name == "dense_format" and v not in ("none", "fp8"):  # this machine's int8 / int4: quant.dense
                v = "none"
            out[name] = bool(v) if name in ("overlap", "moe_a2a") else v
    if all(out[k.key.partition(".")[2]] == getattr(neutral, k.name) for k in knobs if k.key.startswith("deploy.")):
        return None
    return out


def deploy_values(cfg, knobs) -> dict:
    """Deployment fields of a recipe's `deploy` section (none without one)."""
    if cfg.deploy is None:
        return {}
    data = cfg.deploy.model_dump()
    return {k.name: int(data[k.key.partition(".")[2]]) if isinstance(data[k.key.partition(".")[2]], bool)
            else data[k.key.partition(".")[2]] for k in knobs if k.key.startswith("deploy.")}
