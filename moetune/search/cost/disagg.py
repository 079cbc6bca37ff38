"""Disaggregated prefill/decode: P prefill workers and D decode workers, each worker its own mesh
and batch limits (Deployment.prefill_workers > 0; the Deployment's own mesh and max_num_seqs are a
decode worker's, prefill_ep / prefill_tp / prefill_expert_tp / prefill_tokens a prefill worker's).
A request is prefilled on a prefill worker, its KV cache sent to a decode worker, and decoded there.
A prefill worker places the experts by the decode worker's policy without redundant slots (its EP
size differs; a placement file is the decode worker's: contiguous there).

Per worker, steps are priced by the simulator itself (Simulator.price_schedule, so every op keeps
its pricing: mesh.py for a general mesh, the measured tables where they apply):

  prefill step  k whole prompts of the mean prompt length L per attention-DP rank, k = prefill_tokens // L
                (a prompt longer than the budget: its ceil(L / budget) chunks, back to back)
                s_p(k) seconds; a prefill worker serves a_p · k / s_p(k) requests/s
  decode step   b sequences per attention-DP rank at the mean context L + O/2: TPOT(b) seconds
  KV transfer   bytes = L · layers · kv_elems · kv bytes   (MLA: the latent + rope dims per token, DeepSeek
                style; GQA: full K and V of every KV head: SimModel.kv_elems)
                seconds = α + bytes / (lanes · bw · link_eff), over NVLink when every worker fits one node
                (P·N_p + D·N_d ≤ GPUs per node), else the inter-node link; lanes = min(prefill, decode
                attention TP) for GQA (each TP rank sends its heads), 1 for MLA (the latent is whole per rank)

At a request rate λ (whole deployment, requests/s):
  prefill: μ = P · a_p · k_λ / s_p(k_λ), with k_λ the batch a step actually holds (min(k, ⌈λ·s_p / (P·a_p)⌉),
           two fixed-point rounds); ρ = λ / μ must stay < 1; M/D/1 queueing wait W = ρ / (2μ(1 − ρ)),
           its tail taken exponential with that mean: P(wait > x) = ρ·exp(−ρx / W)
  TTFT    = wait + s_p(k_λ) + transfer                                  (queueing + prefill + transfer)
  decode:  b = min(max_num_seqs, λ·(O − 1)·TPOT(b) / (D·a_d))  (Little's law, fixed point); TPOT = TPOT(b)
A closed loop of C requests in flight (`--concurrency`, a burst of n as a closed loop of n) finds λ by
bisection on C = λ · (TTFT(λ) + (O − 1)·TPOT(λ)); beyond the capacity of either side the extra requests
wait (TTFT grows by C/λ_max − the loop's time). Output tok/s = λ·O. A replica is the P + D workers;
`replicas` copies of it each carry their share (replicas.py), per GPU over every GPU of the hardware.

Cost sources (op_tables.py): each worker's steps are priced through the same table path as an aggregated
trial's (the tables bound to that worker's mesh), and each records its own measured share; the trial's
`measured_share` is the two weighted by a request's time in each — prefill s_p(k_λ), decode (O − 1)·TPOT —
`op_sources` each worker's phases as `prefill:PHASE` / `decode:PHASE`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from moetune.search.cost import op_tables
from moetune.search.cost.deployment import Deployment, dp_ranks, gpus
from moetune.search.cost.metrics import Metrics
from moetune.search.cost.precision import precision
from moetune.search.cost.schedule import Schedule, SimWorkload

PCTS = (50, 90, 99)
MEMO_STEPS = 4096  # priced worker steps kept per simulator (one_step)


def prefill_mesh(d: Deployment) -> dict:
    """The prefill worker's mesh fields: its attention DP covers its GPUs; the legacy mesh where that is the same."""
    ep, etp, tp = d.prefill_ep, d.prefill_expert_tp, d.prefill_tp
    N = ep * etp
    if tp == etp and (ep == 1 or d.moe_a2a):  # DP = EP groups of TP ranks: the mesh simulate.py prices itself
        return dict(ep_size=ep, tp_size=tp, expert_tp_size=etp, attn_dp=0)
    return dict(ep_size=ep, tp_size=tp, expert_tp_size=etp, attn_dp=max(1, N // tp))


def workers(d: Deployment) -> tuple[Deployment, Deployment]:
    """(a prefill worker, a decode worker) of a disaggregated deployment, each an aggregated Deployment."""
    one = dict(prefill_workers=0, decode_workers=1, replicas=1)
    placed = d.placement if d.placement in ("contiguous", "round_robin", "eplb") else "contiguous"
    pre = replace(d, **one, **prefill_mesh(d), redundant_experts=0, placement=placed,  # its own EP: no replicas
                  max_num_batched_tokens=d.prefill_tokens,
                  max_num_seqs=d.max_num_seqs, cuda_graph_max_bs=min(d.cuda_graph_max_bs, 0))
    return pre, replace(d, **one)


def total_gpus(d: Deployment) -> int:
    pre, dec = workers(d)
    return d.prefill_workers * gpus(pre) + d.decode_workers * gpus(dec)


def disagg_reason(d: Deployment, max_ranks: int) -> str | None:
    """Why this disaggregated deployment cannot run, or None."""
    if not d.prefill_workers:
        return None
    pre, _ = workers(d)
    if (d.prefill_ep * d.prefill_expert_tp) % d.prefill_tp:
        return (f"prefill attention TP {d.prefill_tp} does not divide the prefill worker's "
                f"{d.prefill_ep * d.prefill_expert_tp} GPUs")
    need = total_gpus(d) * d.replicas
    if need > max_ranks:
        return (f"{d.replicas} × ({d.prefill_workers} prefill × {gpus(pre)} + {d.decode_workers} decode × "
                f"{gpus(replace(d, prefill_workers=0))}) GPUs = {need}; the hardware has {max_ranks}")
    if d.speculative != "none" or d.offload_resident_fraction < 1 or d.capacity_policy != "none":
        return "disaggregated serving is priced without speculation, offloading and capacity limits"
    return None


def kv_transfer(sim, d: Deployment, prompt: float) -> dict:
    """The KV cache of one prompt from a prefill to a decode worker: bytes, link, seconds (module doc)."""
    m, hw = sim.src.model, sim.hw
    pre, dec = workers(d)
    nbytes = prompt * m.L * m.kv_elems * precision(dec, hw, sim.b).kv_b
    in_node = total_gpus(d) <= hw.ranks_per_node
    bw, lat = (hw.intra_bw, hw.intra_latency_s) if in_node else (hw.inter_bw, hw.inter_latency_s)
    lanes = min(pre.tp_size, dec.tp_size) if m.kv_heads else 1
    lanes = max(1, min(lanes, m.kv_heads or 1))
    return {"bytes": float(nbytes), "link": "NVLink" if in_node else "inter-node", "lanes": lanes,
            "seconds": lat + nbytes / (lanes * bw * hw.link_eff)}


def one_step(sim, d: Deployment, rows: list[tuple[float, ...]]) -> tuple[np.ndarray, dict]:
    """([S] seconds, cost-source figures) of the steps `rows` = (prefill, decode, pairs, context, sampled, seqs)
    per attention-DP rank; the figures as an aggregated trial's (op_tables.trial_figures of the tables bound
    to d by Simulator.price_schedule). A pure function of (d, rows) on one simulator: kept in
    `sim.step_memo` (each probe of a load search, and each trial with the same worker, asks again for many
    of the same batches), priced each time where it is None (the plain twin: tests/search/test_sim_speed.py)."""
    memo = sim.step_memo
    if memo is None:
        return _priced_steps(sim, d, rows)
    key = (d, tuple(tuple(r) for r in rows), sim.reference)
    if key not in memo:
        if len(memo) >= MEMO_STEPS:
            memo.pop(next(iter(memo)))
        memo[key] = _priced_steps(sim, d, rows)
    return memo[key]


def worker_schedule(d: Deployment, rows: list[tuple[float, ...]]) -> Schedule:
    """The steps `rows` = (prefill, decode, pairs, context, sampled, seqs), the same on every attention-DP rank of d."""
    R = dp_ranks(d)
    cols = [np.repeat(np.array([r[k] for r in rows], dtype=np.float64)[:, None], R, 1) for k in range(6)]  # [S, R]
    none = np.zeros(0, dtype=np.int64)
    return Schedule(cols[0].astype(np.int64), cols[1].astype(np.int64), cols[2], cols[3], cols[4].astype(np.int64),
                    cols[5].astype(np.int64), none, none)


def _priced_steps(sim, d: Deployment, rows: list[tuple[float, ...]]) -> tuple[np.ndarray, dict]:
    step_s, phases, _ = sim.price_schedule(d, worker_schedule(d, rows))
    return step_s, op_tables.trial_figures(sim.tables, sim.measured, phases)


def cost_figures(pre: dict, dec: dict, prefill_s: float, decode_s: float) -> dict:
    """A disaggregated trial's cost_source / measured_share / op_sources (module doc) from each worker's
    figures at its priced batch; prefill_s, decode_s: a request's seconds on each."""
    if not pre and not dec:
        return {}
    total = prefill_s + decode_s
    share = ((pre.get("measured_share", 0.0) * prefill_s + dec.get("measured_share", 0.0) * decode_s) / total
             if total > 0 else 0.0)
    ops = {**{f"prefill:{k}": v for k, v in (pre.get("op_sources") or {}).items()},
           **{f"decode:{k}": v for k, v in (dec.get("op_sources") or {}).items()}}
    return {"cost_source": dec.get("cost_source", pre.get("cost_source")), "measured_share": share,
            "op_sources": ops, "cost_note": dec.get("cost_note", pre.get("cost_note"))}


class Pricer:
    """The two workers' step times, each priced once per batch size."""

    def __init__(self, sim, d: Deployment, w: SimWorkload):
        self.sim, self.d = sim, d
        self.pre, self.dec = workers(d)
        self.L = float(np.mean(w.prompt_lens))
        self.O = w.output_len
        self._p: dict[int, float] = {}
        self._d: dict[int, float] = {}
        self.figures: dict[tuple[str, int], dict] = {}  # ("prefill", k) | ("decode", b) → its cost-source figures

    @property
    def k_max(self) -> int:
        return max(1, min(self.pre.max_num_seqs, int(self.pre.max_num_batched_tokens // max(self.L, 1))))

    def prefill_rows(self, k: int) -> list[tuple[float, ...]]:
        """The step rows (worker_schedule) of a prefill of k whole prompts per DP rank (a prompt over the
        budget: its chunks, back to back)."""
        L, budget = int(round(self.L)), self.pre.max_num_batched_tokens
        if L <= budget:
            return [(k * L, 0, k * L * (L + 1) / 2, k * L, k, k)]
        n = math.ceil(L / budget)
        chunks = [min(budget, L - j * budget) for j in range(n)]
        return [(t, 0, t * (j * budget + (t + 1) / 2), j * budget + t, int(j == n - 1), 1) for j, t in enumerate(chunks)]

    def decode_rows(self, b: int) -> list[tuple[float, ...]]:
        """The step row of a decode step with b sequences per DP rank at the mean context L + O/2."""
        ctx = self.L + self.O / 2
        return [(0, b, b * ctx, b * ctx, b, b)]

    def prefill_s(self, k: int) -> float:
        """Seconds of a prefill step with k whole prompts per DP rank (a prompt over the budget: its chunks)."""
        if k not in self._p:
            step_s, self.figures[("prefill", k)] = one_step(self.sim, self.pre, self.prefill_rows(k))
            self._p[k] = float(step_s.sum())
        return self._p[k]

    def tpot(self, b: int) -> float:
        """Seconds of a decode step with b sequences per DP rank at the mean context L + O/2."""
        b = max(1, min(b, self.dec.max_num_seqs))
        if b not in self._d:
            step_s, self.figures[("decode", b)] = one_step(self.sim, self.dec, self.decode_rows(b))
            self._d[b] = float(step_s[0])
        return self._d[b]

    def cost_figures(self, k: int, b: int) -> dict:
        """The trial's cost-source figures at prefill batch k and decode batch b (module doc)."""
        b = max(1, min(b, self.dec.max_num_seqs))
        return cost_figures(self.figures.get(("prefill", k), {}), self.figures.get(("decode", b), {}),
                            self.prefill_s(k), max(self.O - 1, 1) * self.tpot(b))


def at_rate(p: Pricer, lam: float, transfer_s: float) -> dict:
    """The steady state at λ requests/s (module doc): prefill batch, ρ, queueing wait, TTFT, TPOT, decode batch."""
    d, a_p, a_d = p.d, dp_ranks(p.pre), dp_ranks(p.dec)
    k = 1
    for _ in range(3):  # the batch a prefill step holds at this rate
        k = min(p.k_max, max(1, math.ceil(lam * p.prefill_s(k) / (d.prefill_workers * a_p))))
    s_p = p.prefill_s(k)
    mu = d.prefill_workers * a_p * k / s_p
    rho = lam / mu
    wait = rho / (2 * mu * (1 - rho)) if rho < 1 else math.inf
    b = 1
    for _ in range(4):  # Little's law on a decode worker's DP ranks
        b = min(p.dec.max_num_seqs, max(1, math.ceil(lam * max(p.O - 1, 1) * p.tpot(b) / (d.decode_workers * a_d))))
    tpot = p.tpot(b)
    decode_cap = d.decode_workers * a_d * p.dec.max_num_seqs / (max(p.O - 1, 1) * p.tpot(p.dec.max_num_seqs))
    return {"k": k, "prefill_s": s_p, "prefill_rps": mu, "rho": rho, "wait_s": wait, "decode_batch": b,
            "tpot_s": tpot, "ttft_s": wait + s_p + transfer_s, "decode_rps": decode_cap,
            "ok": rho < 1 and lam <= decode_cap * (1 + 1e-9)}


def capacity(p: Pricer, transfer_s: float) -> float:
    """The largest λ both sides sustain (ρ < 1 and the decode batch within max_num_seqs): by bisection."""
    lo, hi = 0.0, 1.0
    while at_rate(p, hi, transfer_s)["ok"] and hi < 1e9:
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at_rate(p, mid, transfer_s)["ok"] else (lo, mid)
    return lo * 0.999  # ρ strictly below 1


def closed_loop(p: Pricer, C: int, transfer_s: float) -> tuple[float, dict, float]:
    """(λ, its steady state, extra wait s) of C requests in flight: C = λ·(TTFT + (O − 1)·TPOT), by bisection."""
    def loop_s(state):
        return state["ttft_s"] + max(p.O - 1, 0) * state["tpot_s"]

    cap = capacity(p, transfer_s)
    top = at_rate(p, cap, transfer_s)
    if cap * loop_s(top) <= C:  # saturated: the rest of the C requests wait before prefill
        return cap, top, C / cap - loop_s(top)
    lo, hi = 0.0, cap
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid * loop_s(at_rate(p, mid, transfer_s)) <= C else (lo, mid)
    return lo, at_rate(p, lo, transfer_s), 0.0


def percentile_wait(state: dict, q: float) -> float:
    """The q-quantile of the queueing wait (its tail exponential with the M/D/1 mean: module doc)."""
    rho, mean = state["rho"], state["wait_s"]
    if rho <= 0 or mean <= 0 or not math.isfinite(mean):
        return 0.0 if math.isfinite(mean) else math.inf
    x = mean / rho * math.log(rho / (1 - q)) if rho > 1 - q else 0.0
    return max(0.0, x)


def evaluate(sim, d: Deployment, w: SimWorkload) -> Metrics:
    """Metrics of the disaggregated deployment d under workload w (module doc); every figure estimated."""
    p = Pricer(sim, d, w)
    xfer = kv_transfer(sim, d, p.L)
    if w.mode == "rate":
        lam, state, extra = w.rate, at_rate(p, w.rate, xfer["seconds"]), 0.0
    else:
        C = w.concurrency if w.mode == "concurrency" else w.num_requests
        lam, state, extra = closed_loop(p, max(1, min(C, w.num_requests)), xfer["seconds"])
    fixed = state["prefill_s"] + xfer["seconds"] + extra
    ttft = {f"p{q}": 1e3 * (fixed + percentile_wait(state, q / 100)) for q in PCTS}
    tpot = {f"p{q}": 1e3 * state["tpot_s"] for q in PCTS}
    e2e = {f"p{q}": ttft[f"p{q}"] + 1e3 * max(p.O - 1, 0) * state["tpot_s"] for q in PCTS}
    out = lam * p.O if math.isfinite(state["wait_s"]) else 0.0
    good = lam * _share_within(state, fixed, w) if out else 0.0
    mem = sim.memory(d, w)  # at the load priced (simulate.Simulator.memory)
    m = Metrics(estimated=True, prefill_tok_s=lam * p.L, decode_tok_s=out, output_tok_s=out,
                output_tok_s_per_rank=out / total_gpus(d), ttft_ms=ttft["p50"], tpot_ms=tpot["p50"],
                peak_mem_gb=mem.total / 1e9, ranks=total_gpus(d), workload=f"disaggregated, {_label(w)}",
                latency_ms={"ttft": ttft, "tpot": tpot, "e2e": e2e}, request_s=lam if out else 0.0,
                goodput_rps=good, output_tok_s_per_gpu=out / max(sim.hw.max_ranks, 1))
    m.detail = {"memory": mem.as_dict(), "routing": sim.src.scale_routing or "trace", "disagg": {
        "prefill_workers": d.prefill_workers, "decode_workers": d.decode_workers, "gpus": total_gpus(d),
        "prefill_worker": p.pre.label(), "decode_worker": p.dec.label(), "prefill_batch": state["k"],
        "prefill_s": state["prefill_s"], "prefill_capacity_rps": state["prefill_rps"], "prefill_load": state["rho"],
        "queue_s": state["wait_s"] + extra, "transfer_bytes": xfer["bytes"], "transfer_s": xfer["seconds"],
        "transfer_link": xfer["link"], "transfer_lanes": xfer["lanes"], "decode_batch": state["decode_batch"],
        "decode_capacity_rps": state["decode_rps"], "request_rate": lam}}
    sources = p.cost_figures(state["k"], state["decode_batch"])  # as an aggregated trial's (op_tables.py)
    if sources:
        m.detail.update(sources)
        for side, key in (("prefill", ("prefill", state["k"])), ("decode", ("decode", state["decode_batch"]))):
            m.detail["disagg"][f"{side}_measured_share"] = p.figures.get(key, {}).get("measured_share", 0.0)
    return m


def _share_within(state: dict, fixed: float, w: SimWorkload) -> float:
    """The share of requests meeting both SLOs (the wait's exponential tail; TPOT is the same for all)."""
    if w.slo_tpot_ms is not None and 1e3 * state["tpot_s"] > w.slo_tpot_ms:
        return 0.0
    if w.slo_ttft_ms is None:
        return 1.0
    room = w.slo_ttft_ms / 1e3 - fixed
    if room < 0:
        return 0.0
    rho, mean = state["rho"], state["wait_s"]
    return 1.0 - (rho * math.exp(-rho * room / mean) if mean > 0 else 0.0)


def _label(w: SimWorkload) -> str:
    if w.mode == "rate":
        return f"rate {w.rate:g}/s"
    if w.mode == "concurrency":
        return f"concurrency {w.concurrency}"
    return f"burst of {w.num_requests} priced as a closed loop of {w.num_requests}"
