"""A general mesh's MoE collectives (mesh.py: moe_in / moe_out) from the measured tables (op_tables.py)
at the step's real per-rank message sizes; the roofline where the tables hold no entry, each piece
counted with its source (`Measured.note`), so a mesh trial's measured_share covers them.

| mesh mode | piece | table op | message (x tokens × D elements, bf16) |
|---|---|---|---|
| all-to-all (pure EP over N GPUs) | dispatch, combine | DeepEP low-latency (decode steps) / high-throughput (steps with a prompt) at EP N and its node count (across nodes without rows there: one node's rows, `Measured.deepep_curves`) | the GPU's own rows: max_i T_i / t |
| | | else NCCL all-to-all among N | each GPU's copies out and in, the larger (K per row, local ones included) |
| all-gather (a > 1) | moe_in | NCCL all_gather among the a groups | T = Σ_i T_i (the gathered rows) |
| | moe_out | NCCL reduce_scatter among N, + NCCL all_gather among t (t > 1) | T; max_i T_i |
| all-reduce (a = 1) | moe_out | custom all-reduce among N (one node), else NCCL all_reduce | T |

A collective is looked up only where the table's rows span the same nodes as the mesh's ranks do
(G ≤ GPUs per node: one node; G = 16: two), else it keeps the roofline (`mesh.gather_seconds`).
"""

from __future__ import annotations

import numpy as np

from moetune.search.cost import op_tables, table_curves
from moetune.search.cost.phase_costs import AllToAll

ROOF = "roofline (no table entry)"


def _nodes(G: int, per_node: int) -> int:
    return -(-G // per_node)


def nccl(meas, op: str, G: int, spans: int, tokens) -> np.ndarray | None:
    """[...] seconds of one NCCL collective among G ranks spanning `spans` nodes at `tokens` rows of D, or
    None where the table has no rows for it (its rows of G ranks are one node up to 8, two at 16)."""
    if G <= 1:
        return np.zeros(np.shape(tokens))
    if spans != _nodes(G, 8):
        return None
    c = op_tables.curve(meas.backend, op_tables.Nccl(op, int(meas.model.D), int(G)))
    return None if c is None else table_curves.at(c, tokens)


def all_reduce(meas, G: int, spans: int, tokens) -> np.ndarray | None:
    """An all-reduce of [tokens, D] among G GPUs: the custom all-reduce in one node, else NCCL's."""
    if spans == 1 and G > 1:
        c = op_tables.curve(meas.backend, op_tables.AllReduce(int(meas.model.D), int(G)))
        if c is not None:
            return table_curves.at(c, tokens)
    return nccl(meas, "all_reduce", G, spans, tokens)


def _priced(meas, phase: str, parts: list) -> np.ndarray:
    """Sum of (roofline s, table s or None) parts, each the table where it has one; noted with its source."""
    total = sum(got if got is not None else roof for roof, got in parts)
    measured = sum(got for _, got in parts if got is not None) if any(g is not None for _, g in parts) else 0.0
    meas.note(phase, measured, total, meas.backend.label if any(g is not None for _, g in parts) else ROOF)
    return np.asarray(total, dtype=np.float64)


def gather_exchange(meas, d, per_node: int, T: np.ndarray, T_max: np.ndarray, roof_in: np.ndarray,
                    roof_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([S] moe_in, [S] moe_out) of the all-gather / all-reduce mode (module doc) from the tables where
    they hold each piece; roof_in / roof_out: mesh.gather_seconds' roofline of the same pieces. With
    t > 1 the roofline's moe_out is the reduce-scatter plus the t all-gather: split here by its formula."""
    a, t, N = d.attn_dp, d.tp_size, d.ep_size * d.expert_tp_size
    if meas is None or N == 1:
        return roof_in, roof_out
    spans = _nodes(N, per_node)
    if a == 1:
        return roof_in, _priced(meas, "combine", [(roof_out, all_reduce(meas, N, spans, T))])
    group_spans = 1 if spans == 1 else min(a, spans)  # the a groups sit t GPUs apart
    moe_in = _priced(meas, "dispatch", [(roof_in, nccl(meas, "all_gather", a, group_spans, T))])
    rs = nccl(meas, "reduce_scatter", N, spans, T)
    if t == 1:
        return moe_in, _priced(meas, "combine", [(roof_out, rs)])
    share = (N - 1) / N * T / ((N - 1) / N * T + (t - 1) / t * T_max)  # the reduce-scatter's part of the bytes
    roof_rs, roof_ag = roof_out * share, roof_out * (1 - share)
    ag = nccl(meas, "all_gather", t, 1, T_max)
    return moe_in, _priced(meas, "combine", [(roof_rs, rs), (roof_ag, ag)])


def a2a_exchange(meas, d, per_node: int, a2a: AllToAll, gpu_rows: np.ndarray, copies: np.ndarray,
                 prefill: np.ndarray) -> AllToAll:
    """The all-to-all mode's AllToAll (seconds [S, Lm]) from DeepEP's tables at each GPU's own rows
    (gpu_rows [S]: the largest), else NCCL's all-to-all at the larger of a GPU's copies out and in
    (copies [S, Lm]: the most of any GPU in each layer), else a2a (the roofline) as it is.
    prefill: [S] bool, the step has prompt tokens."""
    if meas is None:
        return a2a
    N = d.ep_size
    deep = meas.deepep_curves()
    if deep is not None:
        ll_d, ll_c, ht_d, ht_c = deep
        got = (np.where(prefill, table_curves.at(ht_d, gpu_rows), table_curves.at(ll_d, gpu_rows)),
               np.where(prefill, table_curves.at(ht_c, gpu_rows), table_curves.at(ll_c, gpu_rows)))
        source = meas.backend.label + " (DeepEP)"
    else:
        one = nccl(meas, "alltoall", N, _nodes(N, per_node), copies)
        got = None if one is None else (one, one)
        source = meas.backend.label + f" (NCCL all-to-all: no DeepEP rows at EP {N})"
    if got is None:
        for phase, s in (("dispatch", a2a.dispatch), ("combine", a2a.combine)):
            meas.note(phase, 0.0, s, ROOF)
        return a2a
    shape = np.shape(a2a.dispatch)
    dispatch, combine = (np.broadcast_to(x if np.ndim(x) == 2 else np.asarray(x)[:, None], shape).astype(np.float64)
                         for x in got)
    for phase, s in (("dispatch", dispatch), ("combine", combine)):
        meas.note(phase, s, s, source)
    return AllToAll(dispatch, combine, a2a.bytes, a2a.inter_node_bytes)
