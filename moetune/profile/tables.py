"""RunTables: the Parquet tables of a run dir as DataFrames (columns documented in SCHEMA.md)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from moetune.profile.ep import EPLayout, step_traffic
from moetune.profile.records import Records
from moetune.profile.trace import RoutingTrace

if TYPE_CHECKING:
    import pandas as pd  # loaded by the functions that build tables: a run dir's mistakes answer without it

TABLES = ("steps", "phases", "layers", "moe", "expert_load", "ep_ranks", "ep_traffic", "nvml", "rank_steps",
          "rank_moe")
RANK_STEPS_COLUMNS = ["step", "kind", "rank", "rank_kind", "batch", "tokens", "seconds"]
RANK_MOE_COLUMNS = ["step", "kind", "layer", "rank", "tokens", "copies_sent", "copies_in", "dispatch_seconds",
                    "combine_seconds", "moe_seconds", "wait_seconds", "transfer_seconds", "dispatch_bytes",
                    "combine_bytes", "same_rank_bytes", "intra_node_bytes", "inter_node_bytes"]


def typed_frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """A table with fixed column types (also when empty): str kinds, float seconds, int the rest."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=columns)
    types = {c: object if "kind" in c else float if "seconds" in c else np.int64 for c in columns}
    return df.astype(types)


@dataclass
class RunTables:
    steps: pd.DataFrame  # step, kind, batch, tokens, context_tokens, attn_pairs, dispatch_bytes, combine_bytes, seconds
    phases: pd.DataFrame  # step, kind, layer, phase, seconds   (layer -1: step-level "other")
    layers: pd.DataFrame  # step, kind, layer, seconds          (measured wall time of the layer)
    moe: pd.DataFrame  # step, kind, layer, tokens, rows, padded_rows
    expert_load: pd.DataFrame  # step, kind, layer, expert, tokens
    ep_ranks: pd.DataFrame  # step, kind, layer, rank, copies, send_bytes, recv_bytes
    ep_traffic: pd.DataFrame  # step, kind, layer, same_rank_bytes, intra_node_bytes, inter_node_bytes
    nvml: pd.DataFrame  # t, memory_used_bytes, gpu_util_pct, mem_util_pct, power_w, sm_clock_mhz
    rank_steps: pd.DataFrame  # RANK_STEPS_COLUMNS: measured on each of R ranks (empty for one process)
    rank_moe: pd.DataFrame  # RANK_MOE_COLUMNS: per lock-step, MoE layer and rank (empty for one process)

    def items(self):
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def build_tables(rec: Records, trace: RoutingTrace, layout: EPLayout, row_bytes: int,
                 nvml: pd.DataFrame | None = None, rank_steps: pd.DataFrame | None = None,
                 rank_moe: pd.DataFrame | None = None) -> RunTables:
    import pandas as pd

    ranks, traffic = ep_tables(trace, layout, row_bytes)
    return RunTables(
        steps=pd.DataFrame(rec.steps, columns=["step", "kind", "batch", "tokens", "context_tokens",
                                               "attn_pairs", "dispatch_bytes", "combine_bytes", "seconds"]),
        phases=pd.DataFrame(rec.phases, columns=["step", "kind", "layer", "phase", "seconds"]),
        layers=pd.DataFrame(rec.layers, columns=["step", "kind", "layer", "seconds"]),
        moe=pd.DataFrame(rec.moe, columns=["step", "kind", "layer", "tokens", "rows", "padded_rows"]),
        expert_load=expert_load_table(rec.counts, rec.kinds, [int(x) for x in trace.layers]),
        ep_ranks=ranks,
        ep_traffic=traffic,
        nvml=nvml if nvml is not None else pd.DataFrame(columns=["t", "memory_used_bytes", "gpu_util_pct",
                                                                 "mem_util_pct", "power_w", "sm_clock_mhz"]),
        rank_steps=rank_steps if rank_steps is not None else typed_frame([], RANK_STEPS_COLUMNS),
        rank_moe=rank_moe if rank_moe is not None else typed_frame([], RANK_MOE_COLUMNS),
    )


def expert_load_table(counts: list[np.ndarray], kinds: list[str], layers: list[int]) -> pd.DataFrame:
    """counts: per step [Lm, E] → long table step, kind, layer, expert, tokens."""
    import pandas as pd

    if not counts:
        return pd.DataFrame(columns=["step", "kind", "layer", "expert", "tokens"])
    stacked = np.stack(counts)  # [S, Lm, E]
    S, Lm, E = stacked.shape
    step, layer_pos, expert = np.meshgrid(np.arange(S), np.arange(Lm), np.arange(E), indexing="ij")
    return pd.DataFrame({
        "step": step.reshape(-1),
        "kind": np.array(kinds)[step.reshape(-1)],
        "layer": np.array(layers)[layer_pos.reshape(-1)],
        "expert": expert.reshape(-1),
        "tokens": stacked.reshape(-1).astype(np.int64),
    })


def ep_tables(trace: RoutingTrace, layout: EPLayout, row_bytes: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per step × layer: copies and bytes per rank, and bytes by locality, computed (see ep.py)."""
    import pandas as pd

    ranks, traffic = [], []
    for s in range(trace.num_steps):
        ids = trace.step(s).astype(np.int64)  # [T, Lm, K]
        step, kind, origin = int(trace.step_index[s]), trace.kind(s), trace.origin(s)
        for j, layer in enumerate(trace.layers):
            t = step_traffic(ids[:, j], layout, row_bytes, origin, int(layer))
            for r in range(layout.ep_size):
                ranks.append({"step": step, "kind": kind, "layer": int(layer), "rank": r,
                              "copies": int(t.copies_in[r]), "send_bytes": int(t.send_bytes[r]),
                              "recv_bytes": int(t.recv_bytes[r])})
            traffic.append({"step": step, "kind": kind, "layer": int(layer), "same_rank_bytes": t.same_rank,
                            "intra_node_bytes": t.intra_node, "inter_node_bytes": t.inter_node})
    return (pd.DataFrame(ranks, columns=["step", "kind", "layer", "rank", "copies", "send_bytes", "recv_bytes"]),
            pd.DataFrame(traffic, columns=["step", "kind", "layer", "same_rank_bytes", "intra_node_bytes",
                                           "inter_node_bytes"]))


# Pivots of the tables, shared by the run's summary (analysis.py) and the per-rank one (ranks/analysis.py).

def load_matrix(expert_load: pd.DataFrame, kind: str) -> tuple[list[int], np.ndarray]:
    """→ (layers, counts [Lm, E]) summed over the steps of `kind`."""
    df = expert_load[expert_load.kind == kind]
    pivot = df.pivot_table(index="layer", columns="expert", values="tokens", aggfunc="sum", fill_value=0)
    return [int(x) for x in pivot.index], pivot.to_numpy()


def rank_matrix(ep_ranks: pd.DataFrame, kind: str, column: str = "copies") -> tuple[list[int], np.ndarray]:
    """→ (layers, [Lm, R]) a per-rank column summed over the steps of `kind`."""
    df = ep_ranks[ep_ranks.kind == kind]
    pivot = df.pivot_table(index="layer", columns="rank", values=column, aggfunc="sum", fill_value=0)
    return [int(x) for x in pivot.index], pivot.to_numpy()
