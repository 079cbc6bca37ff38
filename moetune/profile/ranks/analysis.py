"""Summary of what R ranks measured, per step kind (pure: RunTables + layout → dict).

Per rank: tokens, copies computed, dispatch / combine / MoE seconds, seconds waiting for the slowest
rank (the split-size exchange before each MoE layer's all-to-all), bytes sent by locality, and how
often everyone waited for it. The rank everyone waited for in a (lock-step, layer) is the one that
waited least there: it arrived last. Per layer, balancedness over ranks (mean / max copies):
measured under the run's placement, computed by the what-if for the same placement (equal when
the what-if is right), and computed for contiguous experts without replicas (when R divides E).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.profile import metrics
from moetune.profile.tables import load_matrix, rank_matrix


def slowest_ranks(rank_moe: pd.DataFrame) -> pd.DataFrame:
    """Per (step, layer): the rank everyone waited for (least wait) → step, layer, slowest."""
    if not len(rank_moe):
        return pd.DataFrame(columns=["step", "layer", "slowest"])
    idx = rank_moe.groupby(["step", "layer"]).wait_seconds.idxmin()
    out = rank_moe.loc[idx, ["step", "layer", "rank"]].rename(columns={"rank": "slowest"})
    return out.reset_index(drop=True)


def rank_summary(tables, kind: str, layout) -> dict:
    moe = tables.rank_moe[tables.rank_moe.kind == kind]
    steps = tables.rank_steps[tables.rank_steps.kind == kind]
    slow = slowest_ranks(moe)
    lock_steps = max(steps.step.nunique(), 1)
    moved = float(moe.dispatch_bytes.sum() + moe.combine_bytes.sum())
    moe_s = float(moe.moe_seconds.sum())
    return {
        "per_rank": [_rank_row(r, g, steps[steps["rank"] == r], slow) for r, g in moe.groupby("rank")],
        "per_layer": _layer_rows(tables, kind, moe, slow, layout),
        "mean_over_layers": _mean_balancedness(tables, kind, moe, layout),
        "dispatch_combine_share_of_moe": _share(moe.dispatch_seconds.sum() + moe.combine_seconds.sum(), moe_s),
        "wait_share_of_moe": _share(moe.wait_seconds.sum(), moe_s),
        "bytes_per_step": moved / lock_steps,
        "lock_steps": int(steps.step.nunique()),
    }


def _share(part: float, whole: float) -> float:
    return float(part / whole) if whole else 0.0


def _rank_row(rank: int, g: pd.DataFrame, steps: pd.DataFrame, slow: pd.DataFrame) -> dict:
    moe_s = float(g.moe_seconds.sum())
    return {"rank": int(rank), "tokens": int(steps.tokens.sum()), "idle_steps": int((steps.rank_kind == "idle").sum()),
            "seconds": float(steps.seconds.sum()), "copies_in": int(g.copies_in.sum()),
            "dispatch_s": float(g.dispatch_seconds.sum()), "combine_s": float(g.combine_seconds.sum()),
            "wait_s": float(g.wait_seconds.sum()), "transfer_s": float(g.transfer_seconds.sum()), "moe_s": moe_s,
            "dispatch_combine_share_of_moe": _share(g.dispatch_seconds.sum() + g.combine_seconds.sum(), moe_s),
            "dispatch_bytes": int(g.dispatch_bytes.sum()), "combine_bytes": int(g.combine_bytes.sum()),
            "same_rank_bytes": int(g.same_rank_bytes.sum()), "intra_node_bytes": int(g.intra_node_bytes.sum()),
            "inter_node_bytes": int(g.inter_node_bytes.sum()),
            "waited_for": int((slow.slowest == rank).sum())}


def _balancedness(loads: np.ndarray | None) -> list[float] | None:
    """[Lm, R] → per-layer balancedness (None stays None)."""
    return None if loads is None else [s.balancedness for s in metrics.per_layer_stats(loads)]


def _no_replica_loads(tables, kind: str, layout) -> np.ndarray | None:
    """[Lm, R] copies per rank had every expert one slot, contiguous (None when R does not divide E)."""
    E, R = layout.num_experts, layout.ep_size
    if E % R:
        return None
    _, counts = load_matrix(tables.expert_load, kind)  # [Lm, E]
    return metrics.rank_loads(counts, np.arange(E) // (E // R), R)


def _three(tables, kind: str, moe: pd.DataFrame, layout) -> tuple[list[int], list, list, list | None]:
    measured = moe.pivot_table(index="layer", columns="rank", values="copies_in", aggfunc="sum", fill_value=0)
    layers, computed = rank_matrix(tables.ep_ranks, kind)
    return ([int(x) for x in measured.index], _balancedness(measured.to_numpy()), _balancedness(computed),
            _balancedness(_no_replica_loads(tables, kind, layout)))


def _layer_rows(tables, kind: str, moe: pd.DataFrame, slow: pd.DataFrame, layout) -> list[dict]:
    layers, measured, computed, plain = _three(tables, kind, moe, layout)
    rows = []
    for j, layer in enumerate(layers):
        here = moe[moe.layer == layer]
        waited = slow[slow.layer == layer].slowest.value_counts()
        rows.append({"layer": layer, "balancedness_measured": measured[j], "balancedness_computed": computed[j],
                     "balancedness_without_replicas": None if plain is None else plain[j],
                     "waited_for": {str(int(r)): int(waited.get(r, 0)) for r in sorted(here["rank"].unique())},
                     "wait_ms_per_step": {str(int(r)): float(1e3 * g.wait_seconds.mean())
                                          for r, g in here.groupby("rank")}})
    return rows


def _mean_balancedness(tables, kind: str, moe: pd.DataFrame, layout) -> dict:
    _, measured, computed, plain = _three(tables, kind, moe, layout)
    return {"balancedness_measured": _mean(measured), "balancedness_computed": _mean(computed),
            "balancedness_without_replicas": _mean(plain)}


def _mean(values: list[float] | None) -> float | None:
    return None if not values else float(np.mean(values))
