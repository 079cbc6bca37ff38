"""Measured tensor-parallel collectives of a run on a mesh (SCHEMA.md, `rank_tp.parquet`, summary
`parallel.tp`).

Each rank's RankProfiler keeps, per lock-step, the seconds of its `tp_allreduce` (after attention,
dense MLPs and split MoE layers), `tp_embed` (the vocab-parallel embedding's all-reduce, layer -1)
and `tp_gather` (the LM head's all-gather, layer -1) phases and the payload bytes its TPComm counted:
an all-reduce of x [T, D] counts T·D·itemsize (a ring all-reduce sends 2(G−1)/G of that per rank),
the gather counts the gathered [S, V]. The G ranks of a DP group see the same tokens, so the
tables every run has are merged from one rank per group (`leaders`); this table keeps every rank.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from moetune.probe import TP_PHASES
from moetune.profile.ranks.merge import aligned, lockstep_kind
from moetune.profile.ranks.probe import RankRecord

RANK_TP_COLUMNS = ["step", "kind", "layer", "rank", "dp_rank", "tp_rank", "phase", "tokens", "batch", "calls",
                   "seconds", "bytes"]


def leaders(ranks: list[RankRecord]) -> list[RankRecord]:
    """One record per DP group (its TP rank 0), in DP-group order: the group's tokens once."""
    return sorted((r for r in ranks if r.coords[1] == 0), key=lambda r: r.coords[0])


def rank_tp_table(ranks: list[RankRecord]) -> pd.DataFrame:
    """One row per lock-step × layer × rank × TP collective the rank ran."""
    rows = []
    for n, parts in enumerate(aligned(ranks)):
        kind = lockstep_kind(parts)
        for rec, p in zip(ranks, parts):
            keys = {k for k in p.phases if k[1] in TP_PHASES} | set(p.tp_bytes)
            for layer, phase in sorted(keys):
                nbytes, calls = p.tp_bytes.get((layer, phase), (0, 0))
                rows.append({"step": n, "kind": kind, "layer": layer, "rank": rec.rank, "dp_rank": rec.coords[0],
                             "tp_rank": rec.coords[1], "phase": phase, "tokens": p.tokens, "batch": p.batch,
                             "calls": calls, "seconds": p.phases.get((layer, phase), 0.0), "bytes": nbytes})
    types = {c: object if c in ("kind", "phase") else float if c == "seconds" else "int64" for c in RANK_TP_COLUMNS}
    return pd.DataFrame(rows, columns=RANK_TP_COLUMNS).astype(types)


def tp_summary(table: pd.DataFrame, ranks: list[RankRecord]) -> dict:
    """Per rank and collective over the measured lock-steps: seconds, bytes, calls, share of the
    rank's forward seconds (its step, or its idle forward)."""
    step_s = {rec.rank: sum(p.seconds for p in rec.lock_steps) for rec in ranks}
    per: dict = defaultdict(lambda: {"seconds": 0.0, "bytes": 0, "calls": 0})
    for row in table.itertuples(index=False):
        cell = per[(row.rank, row.phase)]
        cell["seconds"] += row.seconds
        cell["bytes"] += int(row.bytes)
        cell["calls"] += int(row.calls)
    out = []
    for (rank, phase), cell in sorted(per.items()):
        share = cell["seconds"] / step_s[rank] if step_s[rank] > 0 else 0.0
        out.append({"rank": rank, "phase": phase, **cell, "share_of_forward": share})
    return {"per_rank_collective": out, "forward_s": step_s,
            "bytes_rule": "all-reduce of x [T, D]: T·D·itemsize; gather: S·V·itemsize (payload, not wire)"}
