"""The `simulate` evaluator: a cost model that replays a recorded routing trace through a
deployment on a hardware description. Every figure it returns is an estimate (`Metrics.estimated`).

Per lock-step (the schedule from `schedule.py`), each rank's tokens take the next rows of the
trace (prompt tokens from the prefill rows, decode tokens from the decode rows, in recorded order,
cycling), so per-layer skew and co-selection are the recorded ones. Then, per rank r and layer:

  roofline(flops, bytes) = max(flops / (FLOP/s · gemm_eff), bytes / (mem B/s · mem_eff)) + calls · op_overhead
  attention   2·T·W_attn + pair_flops·pairs FLOPs;  W_attn·b + context·kv·b + 2·T·D·b bytes
  router      2·T·D·E;  E·D·b + T·D·b                permute   2·T·K·D·b bytes
  experts(q)  6·rows_q·D·I;  Σ active slots' bytes (by format) + 2·rows_q·D·b      on the rank holding the slot
  dispatch    per rank: 2 collective latencies + bytes to same-node ranks / (NVLink · link_eff)
              + bytes to other nodes / (IB · link_eff); the all-to-all lasts as long as its slowest rank
  combine     the same bytes back                    unpermute 2·T·K·D FLOPs, (T·K + T)·D·b bytes
  offload     stalls from `offload.py` (host link)   shared / dense MLP 6·T·D·I FLOPs, 3·D·I·b bytes
  LM head     2·sampled·D·V FLOPs, D·V·b bytes;  other = per-step engine calls

  layer time = max_r(attention + router + permute) + dispatch + max_q(experts + offload stall)
               + combine + max_r(unpermute + shared)
  straggler wait = layer time − the mean rank's busy time − all-to-all time

A replicated expert's copies split evenly over its replicas (token-index splitting gives that on
average); replica j of an expert is active when the expert has more than j copies.

`CALLS` (torch calls per phase, fixed + per sequence) describes moetune's own engine; on GPUs a
call is one kernel launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moetune.search.cost.formats import expert_bytes
from moetune.search.cost.hardware import Hardware
from moetune.search.cost.memory import RankMemory, memory_reason, rank_memory
from moetune.search.cost.metrics import Metrics
from moetune.search.cost.offload import OffloadState
from moetune.search.cost.schedule import Schedule, SimWorkload, simulate_schedule
from moetune.search.cost.source import TraceSource
from moetune.search.cost.deployment import Deployment, resident_slots

# torch calls per phase and layer: (fixed, per sequence in the step); "step" is once per step.
CALLS = {
    "attention": (22, 6), "router": (8, 0), "permute": (10, 0), "dispatch": (4, 0), "combine": (3, 0),
    "unpermute": (5, 0), "shared_expert": (4, 0), "dense_mlp": (4, 0), "experts_fixed": (3, 0),
    "expert_slot": (5, 0), "step": (60, 12), "lm_head": (4, 1),
}
PHASES = ("attention", "router", "permute", "dispatch", "experts", "offload_wait", "combine", "unpermute",
          "shared_expert", "dense_mlp", "other", "straggler_wait")


@dataclass
class Prepared:
    """Per-deployment arrays (placement-dependent), built once per trial."""

    phy2log: np.ndarray  # [Lm, P]
    slot_rank: np.ndarray  # [P]
    replica_idx: np.ndarray  # [Lm, P] which replica of its expert each slot is
    reps_slot: np.ndarray  # [Lm, P] replicas of the slot's expert
    to_rank: np.ndarray  # [Lm, E, R] share of expert e's copies that go to rank q
    slot_bytes: np.ndarray  # [Lm, P] weight bytes of each slot
    low_share_slot: np.ndarray  # [Lm, P] 1 where the slot's expert is in the low format


class Simulator:
    def __init__(self, source: TraceSource, hardware: Hardware, chunked_prefill: bool = True,
                 multipliers: dict[str, float] | None = None):
        self.src, self.hw, self.chunked = source, hardware, chunked_prefill
        self.k = dict(multipliers or {})  # phase → call-overhead multiplier (calibrate.py), 1 when absent
        self.b = hardware.act_bytes
        self._schedules: dict = {}
        self._link_measured = False
        self._kind = "decode"  # the kind of the step being priced (picks the fitted multipliers)

    # ---- public -------------------------------------------------------------------------------

    def memory(self, d: Deployment) -> RankMemory:
        m = self.src.model
        per_expert = expert_bytes(self.src.loads, m.expert_weights, self.b, d.quant_low_format,
                                  d.quant_hot_fraction, m.D).mean()
        return rank_memory(m, d, self.src.workload, self.b, float(per_expert))

    def memory_reason(self, d: Deployment) -> str | None:
        return memory_reason(self.memory(d), self.hw, d.ep_size)

    def evaluate(self, d: Deployment, workload: SimWorkload | None = None) -> Metrics:
        w = workload or self.src.workload
        sched = self.schedule(d, w)
        prep = self.prepare(d)
        step_s, phases, detail = self._price(d, sched, prep)
        return self._metrics(d, w, sched, step_s, phases, detail)

    def schedule(self, d: Deployment, w: SimWorkload) -> Schedule:
        key = (d.ep_size, d.max_num_seqs, d.max_num_batched_tokens, w)
        if key not in self._schedules:
            self._schedules[key] = simulate_schedule(w, d.ep_size, d.max_num_seqs, d.max_num_batched_tokens,
                                                     self.chunked)
        return self._schedules[key]

    def prepare(self, d: Deployment) -> Prepared:
        from moetune.moe.placement import make_placement

        m, R = self.src.model, d.ep_size
        layers = list(range(m.Lm))
        loads = self.src.loads if d.placement == "eplb" else None  # the engine's policies place without loads
        nodes = max(1, R // min(R, self.hw.ranks_per_node))
        if d.placement in ("contiguous", "round_robin", "eplb"):
            p = make_placement(d.placement, m.E, R, layers, d.redundant_experts, loads,
                               num_nodes=nodes if R % nodes == 0 else 1)
        else:  # a placement file (a recipe's, or --space): its rows, in MoE-layer order
            from moetune.moe.placement import read_placement

            p = read_placement(d.placement)
            if p.num_experts != m.E or p.ep_size != R or len(p.layers) != m.Lm:
                from moetune.errors import MoetuneError

                raise MoetuneError(f"placement file '{d.placement}' is for {p.num_experts} experts on {p.ep_size} "
                                   f"ranks in {len(p.layers)} layers, not this model at ep_size {R}")
        phy2log = p.phy2log  # [Lm, P]
        P = phy2log.shape[1]
        slot_rank = np.arange(P) // (P // R)
        reps = np.stack([np.bincount(row, minlength=m.E) for row in phy2log])  # [Lm, E]
        reps_slot = np.take_along_axis(reps, phy2log, axis=1)
        replica_idx = np.zeros_like(phy2log)
        to_rank = np.zeros((m.Lm, m.E, R))
        for j in range(m.Lm):
            seen = np.zeros(m.E, dtype=np.int64)
            for slot, e in enumerate(phy2log[j]):
                replica_idx[j, slot] = seen[e]
                seen[e] += 1
                to_rank[j, e, slot_rank[slot]] += 1.0 / reps[j, e]
        eb = expert_bytes(self.src.loads, m.expert_weights, self.b, d.quant_low_format, d.quant_hot_fraction, m.D)
        slot_bytes = np.take_along_axis(eb, phy2log, axis=1)
        low = (slot_bytes < m.expert_weights * self.b - 1e-6).astype(np.float64)
        return Prepared(phy2log, slot_rank, replica_idx, reps_slot, to_rank, slot_bytes, low)

    # ---- pricing --------------------------------------------------------------------------------

    def _roof(self, flops, nbytes, calls, ranks: int, phase: str):
        """Roofline + call overhead, slowed by CPU sharing when more ranks than cores run here."""
        hw = self.hw
        share = max(1.0, ranks / hw.ranks_per_node) if hw.name == "this-machine" else 1.0
        t = (np.maximum(flops / (hw.rank_flops(ranks) * hw.gemm_eff), nbytes / (hw.mem_bw * hw.mem_eff))
             + calls * hw.op_overhead_s * self.k.get(f"{phase}/{self._kind}", self.k.get(phase, 1.0)))
        return t * share

    def _measure_link(self, ranks: int) -> None:
        """this-machine's collective latency, measured the first time a multi-rank deployment is priced
        (local gloo processes: a few seconds; it depends on how busy the machine is, so it is not assumed)."""
        from dataclasses import replace

        from moetune.search.cost.hardware import collective_latency

        if self.hw.name != "this-machine" or self._link_measured:
            return
        lat = collective_latency(min(ranks, max(self.hw.ranks_per_node, 2)))
        self.hw = replace(self.hw, intra_latency_s=lat, inter_latency_s=lat,
                          source=self.hw.source + f"; gloo all-to-all latency measured: {lat * 1e6:.0f} µs")
        self._link_measured = True

    def _price(self, d: Deployment, s: Schedule, prep: Prepared):
        if d.ep_size > 1:
            self._measure_link(d.ep_size)
        m, hw, b, R = self.src.model, self.hw, self.b, d.ep_size
        S = s.num_steps
        step_s = np.zeros(S)
        phases = {k: np.zeros(S) for k in PHASES}
        pre_cursor = dec_cursor = 0
        offload = (OffloadState(max(1, resident_slots(d, m.E)),
                   d.offload_eviction, d.offload_prefetch_depth) if d.offload_resident_fraction < 1 else None)
        a2a_bytes = inter_bytes = 0.0
        rank_rows_total = np.zeros((m.Lm, R))
        low_copies = all_copies = 0.0
        rpn = min(R, hw.ranks_per_node)
        node = np.arange(R) // rpn
        same_node = (node[:, None] == node[None, :]) & ~np.eye(R, dtype=bool)  # [R, R]
        other_node = node[:, None] != node[None, :]
        lat = hw.inter_latency_s if other_node.any() else hw.intra_latency_s  # per collective
        for t in range(S):
            self._kind = "prefill" if s.prefill[t].any() else "decode"
            counts = np.zeros((R, m.Lm, m.E))
            for r in range(R):
                rows = []
                p, dd = int(s.prefill[t, r]), int(s.decode[t, r])
                if p:
                    rows.append(_take(self.src.prefill_ids, pre_cursor, p))
                    pre_cursor += p
                if dd:
                    rows.append(_take(self.src.decode_ids if len(self.src.decode_ids) else self.src.prefill_ids,
                                      dec_cursor, dd))
                    dec_cursor += dd
                if rows:
                    ids = np.concatenate(rows).astype(np.int64)  # [T, Lm, K]
                    flat = (np.arange(m.Lm)[None, :, None] * m.E + ids).reshape(-1)
                    counts[r] = np.bincount(flat, minlength=m.Lm * m.E).reshape(m.Lm, m.E)
            T = (s.prefill[t] + s.decode[t]).astype(np.float64)  # [R]
            B = s.seqs[t].astype(np.float64) * (0.0 if hw.grouped_experts else 1.0)  # fused kernels: no per-seq calls
            # per-rank, per-layer costs before the dispatch
            att = self._roof(2 * T * m.attn_weights + m.pair_flops * s.pairs[t],
                             np.where(T > 0, m.attn_weights * b + s.context[t] * m.kv_elems * b + 2 * T * m.D * b, 0),
                             np.where(T > 0, CALLS["attention"][0] + CALLS["attention"][1] * B, 2), R, "attention")  # [R]
            router = self._roof(2 * T * m.D * m.E, m.E * m.D * b + T * m.D * b, CALLS["router"][0], R, "router")
            permute = self._roof(0 * T, 2 * T * m.K * m.D * b, CALLS["permute"][0], R, "permute")
            unperm = self._roof(2 * T * m.K * m.D, (T * m.K + T) * m.D * b, CALLS["unpermute"][0], R, "unpermute")
            shared = (self._roof(6 * T * m.D * m.I_shared, 3 * m.D * m.I_shared * b + 2 * T * m.D * b,
                                 CALLS["shared_expert"][0], R, "shared_expert") if m.I_shared else np.zeros(R))
            # experts on the rank holding each slot
            total = counts.sum(0)  # [Lm, E]
            slot_counts = np.take_along_axis(total, prep.phy2log, axis=1)  # [Lm, P]
            active = slot_counts > prep.replica_idx  # [Lm, P]
            slot_rows = slot_counts / prep.reps_slot
            rows_q = _per_rank(slot_rows, R)  # [Lm, R]
            act_bytes_q = _per_rank(active * prep.slot_bytes, R)
            act_n_q = _per_rank(active.astype(np.float64), R)
            calls = CALLS["experts_fixed"][0] + (0 if hw.grouped_experts else CALLS["expert_slot"][0]) * act_n_q
            experts = self._roof(6 * rows_q * m.D * m.I, act_bytes_q + 2 * rows_q * m.D * b, calls, R, "experts")
            rank_rows_total += rows_q
            low_copies += float((slot_rows * prep.low_share_slot).sum())
            all_copies += float(slot_rows.sum())
            stall = np.zeros((m.Lm, R))
            if offload is not None:
                layer_compute = float(att.max() + router.max() + experts.max(1).mean())
                for q in range(R):
                    lo = q * (prep.phy2log.shape[1] // R)
                    for j in range(m.Lm):
                        needed = list(np.nonzero(active[j, lo: lo + prep.phy2log.shape[1] // R])[0] + lo)
                        stall[j, q] = offload.step(q, j, needed, prep.slot_bytes[j], hw.host_bw,
                                                   layer_compute * d.offload_prefetch_depth, hw.mem_bw / 2)
            # all-to-all: copies from rank r to rank q per layer
            if R > 1:
                copies = np.einsum("rle,leq->rlq", counts, prep.to_rank)  # [R, Lm, R]
                row_bytes = m.D * b
                intra = (copies * same_node[:, None, :]).sum(2) * row_bytes  # [R, Lm] sent in node
                inter = (copies * other_node[:, None, :]).sum(2) * row_bytes
                intra_in = (copies * same_node[:, None, :]).sum(0).T * row_bytes  # [R, Lm] received
                inter_in = (copies * other_node[:, None, :]).sum(0).T * row_bytes
                link = (np.maximum(intra, intra_in) / (hw.intra_bw * hw.link_eff)
                        + np.maximum(inter, inter_in) / (hw.inter_bw * hw.link_eff))  # [R, Lm]
                a2a = link.max(0) + CALLS["dispatch"][0] * hw.op_overhead_s  # [Lm] the rows, either way
                a2a_disp, a2a_comb = a2a + 2 * lat, a2a + lat  # dispatch also exchanges split sizes
                a2a_bytes += 2 * float((intra + inter).sum())
                inter_bytes += 2 * float(inter.sum())
            else:
                a2a_disp = a2a_comb = np.zeros(m.Lm)
            pre = att + router + permute  # [R]
            post = unperm + shared
            exp_stall = experts + stall  # [Lm, R]
            layer = pre.max() + a2a_disp + exp_stall.max(1) + a2a_comb + post.max()  # [Lm]
            busy = (pre + post).mean() + exp_stall.mean(1)  # [Lm]
            dense_layers = len(m.dense_I)
            dense = sum(self._roof(6 * T * m.D * i, 3 * m.D * i * b + 2 * T * m.D * b, CALLS["dense_mlp"][0], R, "dense_mlp")
                        for i in m.dense_I) if dense_layers else np.zeros(R)
            dense_t = (att * dense_layers + dense).max() if dense_layers else 0.0
            sampled = s.sampled[t].astype(np.float64)
            other = self._roof(2 * sampled * m.D * m.V, np.where(sampled > 0, m.D * m.V * b, 0),
                               CALLS["lm_head"][0] + CALLS["lm_head"][1] * np.minimum(sampled, B) + CALLS["step"][0]
                               + CALLS["step"][1] * B, R, "other")
            other = other + (lat if R > 1 else 0.0)  # the lock-step all-reduce ("anything left?")
            step_s[t] = float(layer.sum() + dense_t + other.max())
            Lm = m.Lm
            phases["attention"][t] = float(att.mean() * (Lm + dense_layers))
            phases["router"][t] = float(router.mean() * Lm)
            phases["permute"][t] = float(permute.mean() * Lm)
            phases["dispatch"][t], phases["combine"][t] = float(a2a_disp.sum()), float(a2a_comb.sum())
            phases["experts"][t] = float(experts.mean(1).sum())
            phases["offload_wait"][t] = float(stall.mean(1).sum())
            phases["unpermute"][t] = float(unperm.mean() * Lm)
            phases["shared_expert"][t] = float(shared.mean() * Lm)
            phases["dense_mlp"][t] = float(dense.mean())
            phases["other"][t] = float(other.max())
            phases["straggler_wait"][t] = float((layer - busy - a2a_disp - a2a_comb).clip(min=0).sum()
                                                + (dense_t - (att * dense_layers + dense).mean() if dense_layers else 0))
        rl = rank_rows_total
        detail = {
            "rank_imbalance": float(np.mean(rl.max(1) / np.maximum(rl.mean(1), 1e-12))) if R > 1 else 1.0,
            "a2a_bytes": a2a_bytes, "inter_node_bytes": inter_bytes,
            "low_precision_share": low_copies / all_copies if all_copies else 0.0,
            "offload_stall_s": float(phases["offload_wait"].sum()),
        }
        if offload is not None:
            detail.update(cache_hit_rate=1 - offload.misses / max(offload.needs, 1),
                          fetched_bytes=offload.fetched_bytes, wasted_prefetch_bytes=offload.wasted_bytes)
        return step_s, phases, detail

    def _metrics(self, d: Deployment, w: SimWorkload, s: Schedule, step_s: np.ndarray, phases: dict,
                 detail: dict) -> Metrics:
        mem = self.memory(d)
        detail = {**detail, "memory": mem.as_dict(), "steps": int(s.num_steps)}
        return summarize_steps(True, d.ep_size, w, s.prefill.sum(1), s.decode.sum(1), s.sampled.sum(1),
                               step_s, s.first_step, s.last_step, mem.total, phases, detail)


def summarize_steps(estimated: bool, ranks: int, w: SimWorkload, prefill, decode, sampled, step_s, first, last,
                    peak_bytes: float, phases: dict | None, detail: dict) -> Metrics:
    """Shared by both evaluators: per-step token counts and seconds → Metrics (module docstring of metrics.py)."""
    prefill, decode, sampled, step_s = (np.asarray(x, dtype=np.float64) for x in (prefill, decode, sampled, step_s))
    end = np.cumsum(step_s)
    has_prefill = prefill > 0
    decode_only = ~has_prefill & (decode > 0)
    pre_s, dec_s = step_s[has_prefill].sum(), step_s[decode_only].sum()
    makespan = float(end[-1]) if len(end) else 0.0
    ttft = end[np.asarray(first)] if len(first) else np.zeros(1)
    tpot = ((end[np.asarray(last)] - ttft) / max(w.output_len - 1, 1)) if len(last) else np.zeros(1)
    generated = float(sampled.sum())
    kinds = {"prefill": has_prefill & (decode == 0), "decode": decode_only, "mixed": has_prefill & (decode > 0)}
    per_kind = {}
    if phases:
        for kind, mask in kinds.items():
            if mask.any():
                per_kind[kind] = {p: float(1e3 * v[mask].mean()) for p, v in phases.items()}
                per_kind[kind]["step"] = float(1e3 * step_s[mask].mean())
                per_kind[kind]["steps"] = int(mask.sum())
    return Metrics(
        estimated=estimated,
        prefill_tok_s=float(prefill.sum() / pre_s) if pre_s > 0 else 0.0,
        decode_tok_s=float(decode[decode_only].sum() / dec_s) if dec_s > 0 else 0.0,
        output_tok_s=generated / makespan if makespan > 0 else 0.0,
        output_tok_s_per_rank=generated / makespan / ranks if makespan > 0 else 0.0,
        ttft_ms=float(1e3 * np.median(ttft)), tpot_ms=float(1e3 * np.median(tpot)),
        peak_mem_gb=peak_bytes / 1e9, ranks=ranks, phases_ms=per_kind, detail=detail)


def _take(pool: np.ndarray, cursor: int, n: int) -> np.ndarray:
    """n rows of `pool` from `cursor`, cycling."""
    N = len(pool)
    start = cursor % N
    if start + n <= N:
        return pool[start: start + n]
    idx = (start + np.arange(n)) % N
    return pool[idx]


def _per_rank(x: np.ndarray, R: int) -> np.ndarray:
    """[Lm, P] → [Lm, R] summed over each rank's contiguous slots."""
    Lm, P = x.shape
    return x.reshape(Lm, R, P // R).sum(2)
