"""Measured per-rank tables of a run on R ranks: `rank_steps` and `rank_moe` (SCHEMA.md).

Times and bytes sent come from each rank's own clocks and dispatcher. Copies received and bytes by
locality come from the split sizes the ranks exchanged: S[src, dst] = copies rank src sent to rank
dst's slots (its permute counts over dst's slot range). Rank r sends S[r, d] rows to each d ≠ r
(dispatch) and S[s, r] rows back to each s ≠ r (combine); the 2 · S[r, r] rows it keeps count as
`same_rank` bytes. A row is D · wire dtype bytes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.profile.ep import EPLayout
from moetune.profile.ranks.merge import aligned, lockstep_kind
from moetune.profile.ranks.probe import LockStep, RankRecord
from moetune.profile.tables import RANK_MOE_COLUMNS, RANK_STEPS_COLUMNS, typed_frame

MOE_PHASES = ("router", "offload_wait", "permute", "dispatch", "experts", "combine", "shared_expert", "unpermute")


def send_matrix(counts: np.ndarray, ep_size: int) -> np.ndarray:
    """counts [R, P] copies each rank sent to each physical slot (rank-major) → [R src, R dst]."""
    R, P = counts.shape
    return counts.reshape(R, ep_size, P // ep_size).sum(axis=2)


def locality_rows(S: np.ndarray, rank: int, node: np.ndarray) -> tuple[int, int, int]:
    """Rows rank `rank` keeps (both ways) and sends within / across nodes (dispatch out + combine back)."""
    others = np.arange(len(S)) != rank
    near = (node == node[rank]) & others
    far = node != node[rank]
    same = 2 * int(S[rank, rank])
    intra = int(S[rank, near].sum() + S[near, rank].sum())
    inter = int(S[rank, far].sum() + S[far, rank].sum())
    return same, intra, inter


def rank_steps_table(ranks: list[RankRecord]) -> pd.DataFrame:
    rows = []
    for n, parts in enumerate(aligned(ranks)):
        kind = lockstep_kind(parts)
        rows += [{"step": n, "kind": kind, "rank": r, "rank_kind": p.kind, "batch": p.batch, "tokens": p.tokens,
                  "seconds": p.seconds} for r, p in enumerate(parts)]
    return typed_frame(rows, RANK_STEPS_COLUMNS)


def rank_moe_table(ranks: list[RankRecord], layout: EPLayout, moe_layers: list[int]) -> pd.DataFrame:
    node = layout.node(np.arange(layout.ep_size))  # [R]
    rows = []
    for n, parts in enumerate(aligned(ranks)):
        kind = lockstep_kind(parts)
        for j, layer in enumerate(moe_layers):
            S = send_matrix(np.stack([p.counts[j] for p in parts]), layout.ep_size)  # [R, R]
            for r, p in enumerate(parts):
                rows.append({"step": n, "kind": kind, "layer": layer, "rank": r,
                             **_measured(p, j, layer), **_copies(S, r, node, ranks[r].row_bytes)})
    return typed_frame(rows, RANK_MOE_COLUMNS)


def _measured(p: LockStep, j: int, layer: int) -> dict:
    wait, transfer, dispatch_bytes, combine_bytes = p.io[j]
    return {"tokens": p.tokens, "copies_sent": int(p.counts[j].sum()),
            "dispatch_seconds": p.phases.get((layer, "dispatch"), 0.0),
            "combine_seconds": p.phases.get((layer, "combine"), 0.0),
            "moe_seconds": sum(p.phases.get((layer, name), 0.0) for name in MOE_PHASES),
            "wait_seconds": float(wait), "transfer_seconds": float(transfer),
            "dispatch_bytes": int(dispatch_bytes), "combine_bytes": int(combine_bytes)}


def _copies(S: np.ndarray, r: int, node: np.ndarray, row_bytes: int) -> dict:
    same, intra, inter = locality_rows(S, r, node)
    return {"copies_in": int(S[:, r].sum()), "same_rank_bytes": same * row_bytes,
            "intra_node_bytes": intra * row_bytes, "inter_node_bytes": inter * row_bytes}
