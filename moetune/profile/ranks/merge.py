"""The lock-steps of R ranks → one run's Records and RoutingTrace (the tables every run has).

Lock-step n of every rank becomes step n: its kind is the kind of the ranks that computed (mixed
when they differ), batch / tokens / bytes are summed over ranks, seconds is the slowest rank's
(what the lock-step cost everyone), phase and layer seconds are means over ranks (a phase a rank
did not run counts 0; a layer counts only on ranks that timed it), `other` = seconds − Σ phases.
The routing trace holds rank 0's tokens of the step, then rank 1's, ..., with `token_rank`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from moetune.errors import MoetuneError
from moetune.profile.metrics import padded_rows
from moetune.profile.ranks.probe import LockStep, RankRecord
from moetune.profile.records import Records
from moetune.profile.trace import KINDS, RoutingTrace, id_dtype


def lockstep_kind(parts: list[LockStep]) -> str:
    kinds = {p.kind for p in parts if p.kind != "idle"}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def aligned(ranks: list[RankRecord]) -> list[list[LockStep]]:
    """[S][R] lock-steps by step, then rank; every rank must have kept the same lock-steps."""
    counts = {len(r.lock_steps) for r in ranks}
    if len(counts) != 1:
        raise MoetuneError(f"expert-parallel ranks recorded different numbers of lock-steps ({sorted(counts)}); "
                           "re-run the profile")
    return [[r.lock_steps[n] for r in ranks] for n in range(counts.pop())]


def merge_records(ranks: list[RankRecord], moe_layers: list[int], num_experts: int) -> Records:
    rec = Records()
    for n, parts in enumerate(aligned(ranks)):
        kind = lockstep_kind(parts)
        seconds = max(p.seconds for p in parts)
        rec.steps.append({"step": n, "kind": kind, "batch": sum(p.batch for p in parts),
                          "tokens": sum(p.tokens for p in parts),
                          "context_tokens": sum(p.context_tokens for p in parts),
                          "attn_pairs": sum(p.attn_pairs for p in parts),
                          "dispatch_bytes": int(sum(p.io[:, 2].sum() for p in parts)),
                          "combine_bytes": int(sum(p.io[:, 3].sum() for p in parts)), "seconds": seconds})
        _merge_times(rec, n, kind, parts, seconds)
        _merge_moe(rec, n, kind, parts, moe_layers, num_experts)
    return rec


def _merge_times(rec: Records, n: int, kind: str, parts: list[LockStep], seconds: float) -> None:
    R = len(parts)
    phases: dict = defaultdict(float)
    for p in parts:
        for key, secs in p.phases.items():
            phases[key] += secs / R
    for (layer, name), secs in sorted(phases.items()):
        rec.phases.append({"step": n, "kind": kind, "layer": layer, "phase": name, "seconds": secs})
    rec.phases.append({"step": n, "kind": kind, "layer": -1, "phase": "other",
                       "seconds": max(seconds - sum(phases.values()), 0.0)})
    timed: dict = defaultdict(list)
    for p in parts:
        for layer, secs in p.layers.items():
            timed[layer].append(secs)
    for layer, values in sorted(timed.items()):
        rec.layers.append({"step": n, "kind": kind, "layer": layer, "seconds": float(np.mean(values))})


def _merge_moe(rec: Records, n: int, kind: str, parts: list[LockStep], moe_layers: list[int], E: int) -> None:
    """moe rows (padding of the rows each slot received), logical expert counts, routing."""
    ids = np.concatenate([p.ids for p in parts])  # [T, Lm, K] rank-major
    slots = np.sum([p.counts for p in parts], axis=0)  # [Lm, P] rows each physical slot computed
    for j, layer in enumerate(moe_layers):
        rec.moe.append({"step": n, "kind": kind, "layer": layer, "tokens": int(ids.shape[0]),
                        "rows": int(slots[j].sum()), "padded_rows": padded_rows(slots[j], parts[0].block_m[j])})
    flat = ids.astype(np.int64)
    rec.counts.append(np.stack([np.bincount(flat[:, j].reshape(-1), minlength=E)
                                for j in range(len(moe_layers))]))  # [Lm, E]
    rec.ids.append(ids)
    rec.kinds.append(kind)


def merged_trace(ranks: list[RankRecord], rec: Records, moe_layers: list[int], num_experts: int) -> RoutingTrace:
    """The run's routing: per lock-step rank 0's tokens, then rank 1's, ...; `token_rank` says whose."""
    steps = aligned(ranks)
    lens = [ids.shape[0] for ids in rec.ids]
    owner = [np.repeat(np.arange(len(parts)), [p.tokens for p in parts]) for parts in steps]
    K = ranks[0].lock_steps[0].ids.shape[2] if steps else 0
    return RoutingTrace(
        topk_ids=np.concatenate(rec.ids) if rec.ids else np.zeros((0, len(moe_layers), K), id_dtype(num_experts)),
        step_offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
        step_kind=np.array([KINDS.index(k) for k in rec.kinds], dtype=np.uint8),
        step_index=np.arange(len(rec.ids), dtype=np.int64),
        layers=np.array(moe_layers, dtype=np.int16),
        num_experts=num_experts,
        token_rank=(np.concatenate(owner) if owner else np.zeros(0)).astype(np.int16),
    )
