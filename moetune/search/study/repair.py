"""A sampled point the engine cannot run as asked, repaired to the nearest point that runs, so
that the study spends its trials on deployments rather than on pruned combinations (most of the
default grid's (ep_size, redundant_experts, replicas) triples do not tile the GPUs):

- redundant slots N rounded up until the E + N slots tile the R ranks ((E + N) % R = 0);
- replicas > 1 are copies filling the GPUs: GPUs / (R·G) of them (one when R·G does not divide them);
- expert TP narrowed until EP × expert TP fits the GPUs; a general mesh's attention DP dividing the
  experts' GPUs (attention TP the rest), all-gather dispatch under expert TP;
- offloading at R > 1 (the engine offloads on one rank only): every expert resident;
- (fit_memory, simulated searches: the evaluator's `memory_rule`) a point over the per-rank memory
  estimate stepped by MOVES, least harm first, to the first point that fits, each move only to a value
  the space's domain holds (a disaggregated point's prefill worker widened among them; docs/search.md "Repair").

A repaired trial says what it ran and why (the trial's `same_as` note, trials.csv `deployment`),
and reuses the result of an earlier trial of the same deployment, like a canonical twin.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.deployment import gpus as replica_gpus
from moetune.search.cost.disagg import total_gpus
from moetune.search.study.deploy_knobs import repair_mesh, repair_workers
from moetune.search.study.space import Limits, Space, prune


def repair(d: Deployment, num_experts: int, gpus: int, meshes: bool = False) -> tuple[Deployment, list[str]]:
    """d as the nearest point that runs, and what changed (module doc); `meshes`: the space searches the
    general meshes (attn_dp: a GPU search), where a point is repaired to the meshes the engines run."""
    out, notes = d, []
    R = d.ep_size
    if R > gpus:
        return d, notes  # no repair: pruned (more ranks than the hardware has)
    if (num_experts + d.redundant_experts) % R:
        n = d.redundant_experts + (-(num_experts + d.redundant_experts)) % R
        out = replace(out, redundant_experts=n)
        notes.append(f"redundant_experts {d.redundant_experts} → {n} (the {num_experts} + N slots tile {R} ranks)")
    out, notes = repair_mesh(out, gpus, notes, meshes)  # a general mesh: attention DP dividing its GPUs (deploy_knobs.py)
    out, notes = repair_workers(out, gpus, notes)  # disaggregated: workers that fit (deploy_knobs.py)
    W = total_gpus(out) if out.prefill_workers else replica_gpus(out)  # one replica's GPUs (any mesh; P + D workers)
    if d.replicas > 1 and d.replicas * W != gpus:
        n = gpus // W if gpus % W == 0 else 1
        out = replace(out, replicas=n)
        notes.append(f"replicas {d.replicas} → {n} (copies fill the {gpus} GPUs, {W} each)")
    if R > 1 and d.offload_resident_fraction < 1:
        out = replace(out, offload_resident_fraction=1.0, offload_prefetch_depth=0, offload_eviction="lru")
        notes.append(f"offloading at ep_size {R} → every expert resident (the engine offloads on one rank)")
    return out, notes


# ---- memory: a point that does not fit, stepped to the nearest that does ---------------------------------

@dataclass(frozen=True)
class MemoryRule:
    """The evaluator's memory estimate (simulated searches only): bytes a rank needs, and why it does not fit."""

    need: Callable[[Deployment], float]  # bytes per rank (the quantity each move must lower)
    reason: Callable[[Deployment], str | None]  # None when the point fits


LOW_ORDER = ("none", "fp8", "int8", "int4")  # expert formats, most bytes first
STEPS = tuple(2 ** p for p in range(13, 2, -1))  # max_num_batched_tokens / max_num_seqs tried: 8192 .. 8, down
# the moves, least harm first. Each value tried in turn; a value is kept only when the space allows it,
# prune() passes and the rank needs fewer bytes; at the first point that fits the moves stop, and then
# each knob moved (most harmful first, ep_size aside) is set back as far toward its sampled value as still fits
MOVES = ("kv_format", "dense_format", "quant_low_format:fp8", "quant_hot_fraction", "redundant_experts",
         "prefill_expert_tp", "prefill_ep", "quant_low_format", "max_num_batched_tokens", "max_num_seqs", "ep_size")
# (prefill_*: a disaggregated point's prefill worker over more GPUs, its experts split wider, before a format below
# fp8 that both workers would run — where the prefill worker is the fuller of the two, e.g. DeepSeek-V3's on 1 GPU)
ORDER = {"kv_format": ("none", "fp8"), "dense_format": ("none", "fp8"), "quant_low_format": LOW_ORDER,
         "quant_hot_fraction": (0.5, 0.25, 0.125, 0.0), "max_num_batched_tokens": (16384, *STEPS),
         "max_num_seqs": (1024, *STEPS)}  # each knob's values, least harm (most bytes) first
RELAX = ("max_num_seqs", "max_num_batched_tokens", "quant_low_format", "quant_hot_fraction", "dense_format",
         "kv_format")  # set back in this order (most harmful move first)


def fit_memory(d: Deployment, space: Space, lim: Limits, rule: MemoryRule) -> tuple[Deployment, list[str]]:
    """d stepped by MOVES until it fits, with a note of what changed from what; d unchanged (no notes) when
    it fits already or when no allowed sequence of moves makes it fit (then the memory rule prunes it)."""
    if rule.reason(d) is None:
        return d, []
    allowed = {k.name: k.values for k in space.knobs}
    ok = lambda c: _allowed(c, d, allowed, lim.num_experts) and prune(c, lim) is None  # noqa: E731
    cur = d
    for move in MOVES:
        for cand in _candidates(cur, move, lim.max_ranks, lim.num_experts):
            if ok(cand) and rule.need(cand) < rule.need(cur):
                cur = cand
                if rule.reason(cur) is None:
                    out = _relax(d, cur, ok, rule)
                    return out, [_note(d, out, rule)]
    return d, []


def _relax(d: Deployment, cur: Deployment, ok: Callable[[Deployment], bool], rule: MemoryRule) -> Deployment:
    """Each knob the moves changed set back to the value nearest its sampled one that still fits."""
    for name in RELAX:
        order, was, now = ORDER[name], getattr(d, name), getattr(cur, name)
        if was == now or was not in order or now not in order:
            continue
        for value in order[order.index(was):order.index(now)]:  # the sampled value first
            cand = replace(cur, **{name: value})
            if ok(cand) and rule.reason(cand) is None:
                cur = cand
                break
    return cur


def _candidates(d: Deployment, move: str, gpus: int, num_experts: int) -> list[Deployment]:
    name, _, only = move.partition(":")
    if name in ("kv_format", "dense_format"):
        return [replace(d, **{name: "fp8"})] if getattr(d, name) == "none" else []
    if name == "quant_low_format":
        lower = LOW_ORDER[LOW_ORDER.index(d.quant_low_format) + 1:]
        return [replace(d, quant_low_format=f) for f in lower if not only or f == only]
    if name == "quant_hot_fraction":
        return [replace(d, quant_hot_fraction=h) for h in (0.25, 0.125, 0.0) if h < d.quant_hot_fraction]
    if name == "redundant_experts":  # fewer hot-expert replicas, still tiling the ranks
        fewer = range(d.redundant_experts - 1, -1, -1)
        return [replace(d, redundant_experts=n) for n in fewer if (num_experts + n) % d.ep_size == 0]
    if name in ("max_num_batched_tokens", "max_num_seqs"):
        value = getattr(d, name)
        return [replace(d, **{name: v}) for v in STEPS if v < value]
    if name in ("prefill_expert_tp", "prefill_ep"):  # a prefill worker's GPUs doubled, each a new point (prune: fit)
        if not d.prefill_workers:
            return []
        value = getattr(d, name)
        wider = (value * 2 ** k for k in range(1, 8) if value * 2 ** k <= gpus)
        return [replace(d, **{name: v}) for v in wider if name == "prefill_expert_tp" or num_experts % v == 0]
    W = max(d.tp_size, d.expert_tp_size)  # ep_size: more ranks per replica, fewer replicas; N re-tiled up or down
    wider = [r for r in range(d.ep_size + 1, gpus // W + 1) if (gpus // W) % r == 0 or d.replicas == 1]
    out = []
    for r in wider:
        e = replace(d, ep_size=r, replicas=max(1, gpus // (r * W)) if d.replicas > 1 else 1)
        down = d.redundant_experts - (num_experts + d.redundant_experts) % r
        out += [repair(e, num_experts, gpus)[0]] + ([repair(replace(e, redundant_experts=down), num_experts, gpus)[0]]
                                                   if down >= 0 and down != d.redundant_experts else [])
    return out


def _allowed(cand: Deployment, start: Deployment, allowed: dict, num_experts: int) -> bool:
    """Every knob the moves changed is a searched one, at a value of its --space domain (redundant slots:
    or a domain value rounded up to tile the ranks, as `repair` rounds a sampled one)."""
    a, b = cand.as_dict(), start.as_dict()
    domain = dict(allowed)
    if "redundant_experts" in domain:
        E, R = num_experts, cand.ep_size
        domain["redundant_experts"] = {n + (-(E + n)) % R for n in domain["redundant_experts"]}
    return all(k in domain and a[k] in domain[k] for k in a if a[k] != b[k])


def _note(d: Deployment, out: Deployment, rule: MemoryRule) -> str:
    a, b = d.as_dict(), out.as_dict()
    order = [m.partition(":")[0] for m in MOVES]
    keys = sorted((k for k in a if a[k] != b[k]), key=lambda k: order.index(k) if k in order else len(order))
    moved = ", ".join(f"{k} {a[k]} → {b[k]}" for k in keys)
    return f"memory: {moved} (needs {rule.need(d) / 1e9:.1f} → {rule.need(out) / 1e9:.1f} GB per rank to fit)"
