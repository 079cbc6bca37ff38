"""Per-phase call-overhead multipliers fitted on a run recorded on this machine.

On a CPU, a small MoE's phases are dominated by per-call overhead, not by FLOPs or bytes, and how
many torch calls a phase makes is a property of moetune's engine that `CALLS` (phase_costs.py) only
sketches. When the trace was recorded on this machine (device cpu) and the hardware is
`this-machine`, each phase's measured seconds in the run (phases.parquet) minus its roofline
time is divided by its sketched call overhead (CALLS × the microbenchmarked cost of one call):

    k_phase = Σ max(measured − roofline, 0) / Σ calls(B, active) · op_overhead      over every (step, layer)

and the simulator multiplies that phase's call overhead by k_phase. One number per phase and step
kind (`attention/prefill`, `attention/decode`, and `attention` over both as the fallback), fitted
on the run's own batch; the schedule, EP, placement and batch-size effects are still the model's.
The run's probes add a few µs per phase, which the fit absorbs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.search.cost.hardware import Hardware
from moetune.search.cost.simmodel import SimModel

FITTED = ("attention", "router", "permute", "experts", "unpermute", "shared_expert", "dense_mlp", "other")


def fit_multipliers(tables, m: SimModel, hw: Hardware, calls: dict) -> dict[str, float]:
    steps = tables.steps.set_index("step")
    ph = tables.phases
    active = (tables.expert_load[tables.expert_load.tokens > 0].groupby(["step", "layer"]).size()
              .rename("active"))
    rows = tables.moe.set_index(["step", "layer"]).rows
    out = {}
    for phase in FITTED:
        for kind in (None, "prefill", "decode"):
            df = ph[(ph.phase == phase) & ((ph.kind == kind) if kind else True)]
            k = _fit(df, phase, steps, active, rows, m, hw, calls)
            if k is not None:
                out[phase if kind is None else f"{phase}/{kind}"] = k
    return out


def _fit(df, phase, steps, active, rows, m, hw, calls) -> float | None:
    if df.empty:
        return None
    B = steps.batch.reindex(df.step).to_numpy(dtype=float)
    T = steps.tokens.reindex(df.step).to_numpy(dtype=float)
    pairs = steps.attn_pairs.reindex(df.step).to_numpy(dtype=float)
    ctx = steps.context_tokens.reindex(df.step).to_numpy(dtype=float)
    idx = pd.MultiIndex.from_arrays([df.step, df.layer])
    act = active.reindex(idx).fillna(0).to_numpy(dtype=float)
    r = rows.reindex(idx).fillna(0).to_numpy(dtype=float)
    roof, n_calls = _roof_and_calls(phase, m, hw, calls, B, T, pairs, ctx, act, r)
    overhead = n_calls * hw.op_overhead_s
    residual = np.maximum(df.seconds.to_numpy() - roof, 0.0)
    return float(residual.sum() / overhead.sum()) if overhead.sum() > 0 else None


def _roof_and_calls(phase, m: SimModel, hw: Hardware, calls, B, T, pairs, ctx, active, rows):
    b, F, BW = hw.act_bytes, hw.flops * hw.gemm_eff, hw.mem_bw * hw.mem_eff

    def roof(flops, nbytes):
        return np.maximum(flops / F, nbytes / BW)

    if phase == "attention":
        return (roof(2 * T * m.attn_weights + m.pair_flops * pairs, m.attn_weights * b + ctx * m.kv_elems * b),
                calls["attention"][0] + calls["attention"][1] * B)
    if phase == "router":
        return roof(2 * T * m.D * m.E, m.E * m.D * b + T * m.D * b), calls["router"][0] + 0 * B
    if phase == "permute":
        return roof(0 * T, 2 * T * m.K * m.D * b), calls["permute"][0] + 0 * B
    if phase == "unpermute":
        return roof(2 * T * m.K * m.D, (T * m.K + T) * m.D * b), calls["unpermute"][0] + 0 * B
    if phase == "experts":
        per_slot = 0 if hw.grouped_experts else calls["expert_slot"][0]
        return (roof(6 * rows * m.D * m.I, active * m.expert_weights * b), calls["experts_fixed"][0] + per_slot * active)
    if phase == "shared_expert":
        return roof(6 * T * m.D * m.I_shared, 3 * m.D * m.I_shared * b), calls["shared_expert"][0] + 0 * B
    if phase == "dense_mlp":
        i = max(m.dense_I) if m.dense_I else 0
        return roof(6 * T * m.D * i, 3 * m.D * i * b), calls["dense_mlp"][0] + 0 * B
    # other: LM head over each sequence's sampled token + per-step engine work
    return (roof(2 * B * m.D * m.V, m.D * m.V * b),
            calls["step"][0] + calls["step"][1] * B + calls["lm_head"][0] + calls["lm_head"][1] * B)
