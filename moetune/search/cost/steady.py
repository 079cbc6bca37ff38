"""Per-request latency of a priced schedule, and the steady-state window of a `concurrency` or
`rate` workload (schedule.py).

Per request i: arrival a_i (0 in a burst; the start of the step it joined in a closed loop; the
Poisson time in an open loop), TTFT = end of the step that sampled its first token − a_i, TPOT =
(end of its last step − end of its first) / (output tokens − 1), end-to-end = end of its last step
− a_i.

Steady state: the first `warmup` requests (by arrival) are excluded, and as many at the end (the
drain, where fewer are in flight); latency percentiles are over the rest (the measured requests).
The window runs from the arrival of the first measured request to the arrival of the first request
after them; throughput in it = tokens sampled in steps ending inside / its length, requests/s =
requests finishing inside / its length, goodput = requests/s × the share of measured requests
whose TTFT and TPOT are both within the SLOs (an SLO not set is not applied). A burst has no
steady state: its figures are over every request and the whole run, labelled `burst`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moetune.search.cost.schedule import SimWorkload

PERCENTILES = (50, 90, 99)


def poisson_arrivals(n: int, rate: float, seed: int) -> np.ndarray:
    """[n] arrival times (s) of a Poisson process of `rate` requests/s, the first at 0 (seeded)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)  # [n]
    gaps[0] = 0.0
    return np.cumsum(gaps)


@dataclass(frozen=True)
class Latency:
    ttft: np.ndarray  # [n] seconds
    tpot: np.ndarray  # [n]
    e2e: np.ndarray  # [n]


def request_latency(w: SimWorkload, end: np.ndarray, first: np.ndarray, last: np.ndarray,
                    arrival_s: np.ndarray) -> Latency:
    """end: [S] cumulative seconds at each step's end; first/last: [n] steps; arrival_s: [n]."""
    t_first, t_last = end[first], end[last]  # [n]
    return Latency(t_first - arrival_s, (t_last - t_first) / max(w.output_len - 1, 1), t_last - arrival_s)


def measured_slice(w: SimWorkload) -> slice:
    """The measured requests: `warmup` dropped at each end, at least one kept."""
    n = w.num_requests
    k = min(w.warmup, max(0, (n - 1) // 2)) if w.mode != "burst" else 0
    return slice(k, n - k)


def steady_figures(w: SimWorkload, end: np.ndarray, sampled: np.ndarray, lat: Latency, arrival_s: np.ndarray,
                   ranks: int) -> dict:
    """The workload's label, latency percentiles (ms) and the window's rates (module docstring)."""
    n, part = w.num_requests, measured_slice(w)
    done_s = lat.e2e + arrival_s  # [n] finish times
    if w.mode == "burst" or part.stop >= n:
        t0, t1 = 0.0, float(end[-1]) if len(end) else 0.0
    else:
        t0, t1 = float(arrival_s[part.start]), float(arrival_s[part.stop])
    if t1 <= t0:  # too few requests for a window: the whole run
        t0, t1 = 0.0, float(end[-1])
    inside = (end > t0) & (end <= t1)  # [S]
    span = t1 - t0
    tokens = float(sampled[inside].sum())
    requests_s = float(((done_s > t0) & (done_s <= t1)).sum()) / span
    good = np.ones(part.stop - part.start, dtype=bool)
    if w.slo_ttft_ms is not None:
        good &= lat.ttft[part] * 1e3 <= w.slo_ttft_ms
    if w.slo_tpot_ms is not None:
        good &= lat.tpot[part] * 1e3 <= w.slo_tpot_ms
    qs = sorted(set(PERCENTILES) | {w.slo_percentile})  # the SLOs' own percentile too (slo_load.py)
    pct = {name: {f"p{q:g}": float(1e3 * np.percentile(v[part], q)) for q in qs}
           for name, v in (("ttft", lat.ttft), ("tpot", lat.tpot), ("e2e", lat.e2e))}
    return {"workload": label(w), "latency_ms": pct, "output_tok_s": tokens / span,
            "output_tok_s_per_rank": tokens / span / ranks, "request_s": requests_s,
            "goodput_rps": requests_s * float(good.mean()),
            "steady": {"measured_requests": int(part.stop - part.start), "excluded_each_end": int(part.start),
                       "window_s": span}}


def label(w: SimWorkload) -> str:
    """How requests arrived, and the SLOs goodput counts against."""
    if w.mode == "concurrency":
        how = f"concurrency {w.concurrency} per replica (closed loop)"
    elif w.mode == "rate":
        how = f"rate {w.rate:g} req/s per replica (Poisson, seed {w.seed})"
    else:
        how = "burst (every request at t=0)"
    slo = [f"{name} ≤ {v:g} ms" for name, v in (("TTFT", w.slo_ttft_ms), ("TPOT", w.slo_tpot_ms)) if v is not None]
    return f"{how}; goodput SLOs: {', '.join(slo) if slo else 'none set'}"
