"""Per-step token counts and seconds → Metrics, shared by the simulate and measure evaluators:
throughput by step kind, TTFT / TPOT medians, per-request percentiles and the steady-state window
(steady.py) where the workload is not a burst."""

from __future__ import annotations

import numpy as np

from moetune.search.cost.metrics import Metrics
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.steady import request_latency, steady_figures


def summarize_steps(estimated: bool, ranks: int, w: SimWorkload, prefill, decode, sampled, step_s, first, last,
                    peak_bytes: float, phases: dict | None, detail: dict, arrival_s=None) -> Metrics:
    """Shared by both evaluators: per-step token counts and seconds → Metrics (module docstring of
    metrics.py; arrival_s [n]: None for a burst, every request at 0)."""
    prefill, decode, sampled, step_s = (np.asarray(x, dtype=np.float64) for x in (prefill, decode, sampled, step_s))
    end = np.cumsum(step_s)
    has_prefill = prefill > 0
    decode_only = ~has_prefill & (decode > 0)
    pre_s, dec_s = step_s[has_prefill].sum(), step_s[decode_only].sum()  # decode tok/s: tokens emitted (a
    # decode-only step samples one per decode, a verify 1 to k + 1 per sequence)
    makespan = float(end[-1]) if len(end) else 0.0
    ttft = end[np.asarray(first)] if len(first) else np.zeros(1)
    tpot = ((end[np.asarray(last)] - ttft) / max(w.output_len - 1, 1)) if len(last) else np.zeros(1)
    generated = float(sampled.sum())
    m = Metrics(
        estimated=estimated,
        prefill_tok_s=float(prefill.sum() / pre_s) if pre_s > 0 else 0.0,
        decode_tok_s=float(sampled[decode_only].sum() / dec_s) if dec_s > 0 else 0.0,
        output_tok_s=generated / makespan if makespan > 0 else 0.0,
        output_tok_s_per_rank=generated / makespan / ranks if makespan > 0 else 0.0,
        ttft_ms=float(1e3 * np.median(ttft)), tpot_ms=float(1e3 * np.median(tpot)),
        peak_mem_gb=peak_bytes / 1e9, ranks=ranks, phases_ms=_per_kind(phases, step_s, prefill, decode), detail=detail)
    if len(first) and makespan > 0:
        _add_latency(m, w, end, sampled, np.asarray(first), np.asarray(last), arrival_s)
    return m


def _per_kind(phases: dict | None, step_s, prefill, decode) -> dict:
    has_prefill = prefill > 0
    kinds = {"prefill": has_prefill & (decode == 0), "decode": ~has_prefill & (decode > 0),
             "mixed": has_prefill & (decode > 0)}
    per_kind = {}
    if phases:
        for kind, mask in kinds.items():
            if mask.any():
                per_kind[kind] = {p: float(1e3 * v[mask].mean()) for p, v in phases.items()}
                per_kind[kind]["step"] = float(1e3 * step_s[mask].mean())
                per_kind[kind]["steps"] = int(mask.sum())
    return per_kind


def _add_latency(m: Metrics, w: SimWorkload, end, sampled, first, last, arrival_s) -> None:
    """Per-request percentiles and the steady-state window (steady.py); a burst keeps its whole-run figures."""
    arrival = np.zeros(len(first)) if arrival_s is None else np.asarray(arrival_s, dtype=np.float64)
    lat = request_latency(w, end, first, last, arrival)
    fig = steady_figures(w, end, sampled, lat, arrival, m.ranks)
    m.workload, m.latency_ms, m.request_s, m.goodput_rps = (fig["workload"], fig["latency_ms"], fig["request_s"],
                                                            fig["goodput_rps"])
    if w.mode != "burst":
        m.output_tok_s, m.output_tok_s_per_rank = fig["output_tok_s"], fig["output_tok_s_per_rank"]
        m.ttft_ms, m.tpot_ms = fig["latency_ms"]["ttft"]["p50"], fig["latency_ms"]["tpot"]["p50"]
        m.detail = {**m.detail, "steady": fig["steady"]}
