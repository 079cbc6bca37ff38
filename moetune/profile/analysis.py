"""Summary of a run, computed from its tables alone (pure: RunTables + settings → dict).

Load figures per kind are computed per layer from the tokens each expert (or rank) received over
all measured steps of that kind; averages over layers are taken over those per-layer values.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd

from moetune.profile import metrics
from moetune.profile.rates import phase_rates, phase_work
from moetune.profile.ranks.analysis import rank_summary
from moetune.profile.tables import RunTables, load_matrix, rank_matrix
from moetune.profile.trace import KINDS

KIND_ORDER = KINDS


def kinds_in(tables: RunTables) -> list[str]:
    present = set(tables.steps.kind)
    return [k for k in KIND_ORDER if k in present]


def phase_breakdown(tables: RunTables, kind: str) -> list[dict]:
    steps = tables.steps[tables.steps.kind == kind]
    total = float(steps.seconds.sum())
    per = tables.phases[tables.phases.kind == kind].groupby("phase").seconds.sum().sort_values(ascending=False)
    return [{"phase": p, "seconds": float(s), "share": float(s / total) if total else 0.0,
             "ms_per_step": float(1e3 * s / max(len(steps), 1))} for p, s in per.items()]


def layer_closure(tables: RunTables) -> pd.DataFrame:
    """Per step × layer: sum of phase times vs the layer's measured time (ratio ≈ 1)."""
    ph = tables.phases[tables.phases.layer >= 0].groupby(["step", "layer"], as_index=False).seconds.sum()
    df = ph.merge(tables.layers, on=["step", "layer"], suffixes=("_phases", "_layer"))
    return df.assign(ratio=df.seconds_phases / df.seconds_layer)


def load_summary(tables: RunTables, kind: str) -> dict:
    """Per layer: load over experts, and over ranks under the run's layout (the ep_ranks what-if)."""
    layers, counts = load_matrix(tables.expert_load, kind)  # counts: [Lm, E]
    experts = metrics.per_layer_stats(counts)
    ranks = metrics.per_layer_stats(rank_matrix(tables.ep_ranks, kind)[1])  # [Lm, R]
    rows = [{"layer": l, "expert": asdict(e), "rank": asdict(r)} for l, e, r in zip(layers, experts, ranks)]
    return {
        "per_layer": rows,
        "mean_over_layers": {
            "expert_imbalance": metrics.mean_over_layers(experts, "imbalance"),
            "expert_balancedness": metrics.mean_over_layers(experts, "balancedness"),
            "rank_imbalance": metrics.mean_over_layers(ranks, "imbalance"),
            "rank_balancedness": metrics.mean_over_layers(ranks, "balancedness"),
        },
        "hottest_experts": metrics.hottest_experts(counts, layers),
    }


def padding_summary(moe: pd.DataFrame, kind: str) -> dict:
    df = moe[moe.kind == kind]
    rows, padded = int(df.rows.sum()), int(df.padded_rows.sum())
    return {"rows": rows, "padded_rows": padded, "waste": metrics.padding_waste(rows, padded)}


def capacity_summary(tables: RunTables, kind: str, top_k: int, num_experts: int, cf: float) -> dict:
    df = tables.expert_load[tables.expert_load.kind == kind]
    tokens = tables.moe.drop_duplicates(["step"]).set_index("step").tokens
    dropped, copies = 0, 0
    for (step, _layer), group in df.groupby(["step", "layer"]):
        cap = metrics.expert_capacity(int(tokens[step]), top_k, num_experts, cf)
        dropped += metrics.dropped_copies(group.tokens.to_numpy(), cap)
        copies += int(group.tokens.sum())
    return {"capacity_factor": cf, "dropped_copies": dropped, "copies": copies,
            "drop_rate": dropped / copies if copies else 0.0}


def ep_summary(tables: RunTables, kind: str) -> dict:
    traffic = tables.ep_traffic[tables.ep_traffic.kind == kind]
    ranks = tables.ep_ranks[tables.ep_ranks.kind == kind].groupby("rank")
    return {
        "same_rank_bytes": int(traffic.same_rank_bytes.sum()),
        "intra_node_bytes": int(traffic.intra_node_bytes.sum()),
        "inter_node_bytes": int(traffic.inter_node_bytes.sum()),
        "per_rank": [{"rank": int(r), "copies": int(g.copies.sum()), "send_bytes": int(g.send_bytes.sum()),
                      "recv_bytes": int(g.recv_bytes.sum())} for r, g in ranks],
    }


def rates_table(tables: RunTables, dims: dict) -> pd.DataFrame:
    active = (tables.expert_load[tables.expert_load.tokens > 0].groupby(["step", "layer"]).size()
              .rename("active").reset_index())
    return phase_rates(phase_work(dims, tables.steps, tables.moe, active), tables.phases)


def summarize(tables: RunTables, dims: dict, layout, capacity_factor: float | None) -> dict:
    """layout: the EPLayout of the ep_* what-if tables (with R ranks run, the run's own)."""
    out: dict = {"kinds": {}}
    rates = rates_table(tables, dims)
    for kind in kinds_in(tables):
        steps = tables.steps[tables.steps.kind == kind]
        section = {
            "steps": len(steps), "tokens": int(steps.tokens.sum()), "seconds": float(steps.seconds.sum()),
            "tokens_per_s": float(steps.tokens.sum() / steps.seconds.sum()),
            "step_ms_median": float(1e3 * steps.seconds.median()),
            "step_ms_p90": float(1e3 * steps.seconds.quantile(0.9)),
            "phases": phase_breakdown(tables, kind),
            "load": load_summary(tables, kind),
            "padding": padding_summary(tables.moe, kind),
            "ep": ep_summary(tables, kind),
            "rates": rates[rates.kind == kind].drop(columns=["kind"]).to_dict(orient="records"),
        }
        if len(tables.rank_moe):
            section["ranks"] = rank_summary(tables, kind, layout)
        if capacity_factor:
            section["capacity"] = capacity_summary(tables, kind, dims["K"], dims["E"], capacity_factor)
        out["kinds"][kind] = section
    closure = layer_closure(tables)
    out["layer_closure"] = {"median_ratio": float(closure.ratio.median()) if len(closure) else None,
                            "min_ratio": float(closure.ratio.min()) if len(closure) else None}
    return out
