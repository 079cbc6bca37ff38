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

With tensor parallelism (tp.py) every piece is priced on one rank's shapes (heads, intermediate
and vocab split) and the step adds the engine's TP collectives (tp_allreduce, tp_embed, tp_gather).

With a capacity (capacity_policy drop | buffer, factor f) each source rank r keeps at most
C_r = ceil(f · T_r · K / E) copies per expert of its step's trace rows (phase_costs.CapacitySplit);
dispatch, experts and combine carry only those. `drop`: the rest is neither sent nor computed
(detail dropped_fraction = dropped / all copies: the quality risk). `buffer`: the rest runs a second
pass in the same layer, its own phase line `overflow` = max_r(permute) + dispatch + max_q(experts on
the overflow rows, their weights read again, its launches paid even when empty) + combine, added to
the layer time (detail buffered_fraction). At one rank a capacity leaves the fused decode path
(this-machine prices the unfused path factor). `reroute` needs the routers' scores, which the trace
lacks; affinity scheduling and history prefetch hints change which requests share a step and what
is resident, which the trace cannot say without a model of their predictors: not priced here
(`unpriced_reason`; the study's simulate evaluator refuses them, the measure evaluator runs them).

With speculative decoding (speculative.py) a decode verifies j drafts: the schedule gives it 1 + j
rows (attention pairs, experts from the trace's next rows at that count, LM head on every row) and
1 + Σ p^i expected tokens; the drafter is its own line `draft`; on this-machine a verify step is
priced on the fused path when a full verify step fits the fused decode layer (max_num_seqs ×
(1 + k) rows ≤ FUSED_ROWS, model/fused_decode.py: verify rows attend as queries of their own),
else on the unfused path.

A replicated expert's copies split evenly over its replicas (token-index splitting gives that on
average); replica j of an expert is active when the expert has more than j copies.

Each piece is one function of phase_costs.py, keyed by the phase vocabulary; `_price` walks the
steps and `step_totals.add_step` adds the pieces up (the reference: the study prices every step at once with
its vectorised twin, vector.py / vector_price.py, equal within float rounding, where `vector_reason`
allows; `reference = True` keeps the loop). `CALLS` (phase_costs.py: torch calls per phase, fixed +
per sequence) describes moetune's own engine; on GPUs a call is one kernel launch. On
`this-machine` the calibration (calibrate.py) gives the call-overhead multipliers and, per step
kind, the factor of the deployment's path (fused decode layers at R = 1, unfused at R > 1, both
without the profiler's clocks) over the probed phases they were fitted on: each step × it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from moetune.search.cost import disagg
from moetune.search.cost import mesh as mesh_costs
from moetune.search.cost import op_tables
from moetune.search.cost import phase_costs as costs
from moetune.search.cost import speculative as spec_costs
from moetune.search.cost import tp as tp_costs
from moetune.search.cost.deployment import Deployment, gpus, resident_slots
from moetune.search.cost.formats import bytes_per_weight, expert_bytes
from moetune.search.cost.hardware import Hardware
from moetune.search.cost.memory import RankMemory, memory_reason, rank_memory
from moetune.search.cost.metrics import Metrics
from moetune.search.cost.offload import OffloadState
from moetune.search.cost.precision import Precision, precision
from moetune.search.cost.replicas import over_replicas, replica_workload
from moetune.search.cost.schedule import Replay, Schedule, SimWorkload, simulate_schedule
from moetune.search.cost.schedule_fast import compiled_schedule
from moetune.search.cost.slo_load import evaluate_at_slo, load_cap, load_key
from moetune.search.cost.source import TraceSource
from moetune.search.cost.steady import poisson_arrivals
from moetune.search.cost.step_totals import CAPACITY_PRICED, Totals, add_step, overlapped
from moetune.search.cost.summary import summarize_steps
from moetune.search.cost.trace_rows import TraceRows
from moetune.search.cost.vector import vector_reason
from moetune.search.cost.vector_price import graph_step, price_all




def unpriced_reason(d: Deployment) -> str | None:
    """Why the simulator cannot price this deployment without inventing a factor, or None."""
    if d.capacity_policy == "reroute":
        return ("capacity_policy reroute is not priced by the simulator: the trace records the routers' choices, "
                "not their scores, so the next-best expert of an overflowing copy is unknown; use --evaluator measure")
    if d.scheduling != "fcfs":
        return (f"scheduling {d.scheduling} is not priced by the simulator: which requests share a step (and so the "
                "distinct experts and offload hits per step) depends on its predictor, which the trace cannot replay; "
                "use --evaluator measure")
    if d.offload_hints != "router" and d.offload_resident_fraction < 1 and d.offload_prefetch_depth:
        return (f"offload_hints {d.offload_hints} is not priced by the simulator: the offload model prefetches the "
                "next layers' recorded experts and has no model of the routing-history predictor's hit rate; "
                "use --evaluator measure")
    return None


def priced_instead(d: Deployment) -> tuple[Deployment, list[str]]:
    """The nearest deployment the simulator prices, and each key `unpriced_reason` refuses in words
    (recipe key, value, what it was priced as) — `moetune simulate --recipe` labels rather than refuses."""
    notes, changes = [], {}
    if d.capacity_policy == "reroute":
        notes.append("parallel.capacity_policy reroute (priced as no capacity limit)")
        changes["capacity_policy"] = "none"
    if d.scheduling != "fcfs":
        notes.append(f"engine.scheduling {d.scheduling} (priced as fcfs)")
        changes["scheduling"] = "fcfs"
    if d.offload_hints != "router" and d.offload_resident_fraction < 1 and d.offload_prefetch_depth:
        notes.append(f"offload.hints {d.offload_hints} (priced as router)")
        changes["offload_hints"] = "router"
    return replace(d, **changes), notes


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
    fp8_slot: np.ndarray  # [Lm, P] 1 where the slot's weights are fp8 (the low format's, or the checkpoint's own)


class Simulator:
    def __init__(self, source: TraceSource, hardware: Hardware, chunked_prefill: bool = True,
                 multipliers: dict[str, float] | None = None, calibration=None):
        self.src, self.hw, self.chunked = source, hardware, chunked_prefill
        self.k = dict(multipliers or {})  # phase → call-overhead multiplier (calibrate.py), 1 when absent
        self.cal = calibration  # calibrate.Calibration of this-machine (path factors, link latency) or None
        self.terms: dict | None = None  # --explain: (kind, phase) → summed cost-model terms (explain.py)
        self.b = hardware.act_bytes
        self.prec = Precision.plain(self.b)  # the deployment being priced: dense / KV / fp8 figures (precision.py)
        self._launch_s = 0.0  # CPU seconds per eager kernel launch in the step being priced (0: graph / not priced)
        self._schedules: dict = {}
        self._link_measured = False
        self._allreduce_s: dict[int, float] = {}  # this-machine: measured all-reduce latency per TP group size
        self._kind = "decode"  # the kind of the step being priced (picks the fitted multipliers)
        self.group = 1  # processes per priced rank: G in a TP view (they share this-machine's cores too)
        self.on_step = None  # progress: on_step(done, total or None) after each priced lock-step (cli)
        # this-machine: the base recipe and d → the deployment's RunConfig (study/setup.py), so that a
        # deployment whose path the base microbenchmarks did not run is timed on its own (`own_path`)
        self.base_config = None
        self.config_of = None
        self.spec_acceptance: float | None = None  # --spec-acceptance: assumed where the trace did not measure it
        self._draft_models: dict = {}
        self.reference = False  # True: every schedule priced step by step (the twin of vector_price.py)
        self._placements: dict = {}  # (policy, E, R, Lm, N, nodes) → the placement (trace loads fixed)
        self.pool_cache: dict = {}  # trace pool → its prefix counts (vector.PoolCounts), kept across trials
        self.tables = self.measured = None  # op_tables: the chosen tables (--engine; None: roofline), bound to d
        self.load_hints: dict = {}  # ranks per replica → the load last found meeting the SLOs (slo_load.py)
        self.step_memo: dict | None = {}  # disagg.one_step: a worker's priced steps (None: priced each time)

    # ---- public -------------------------------------------------------------------------------

    def stored(self, d: Deployment) -> Deployment:
        """d as an fp8 checkpoint runs it (SimModel.weight_format fp8): the dense projections and every
        expert not given a lower format stay fp8 (the engines serve such a checkpoint as stored)."""
        if self.src.model.weight_format != "fp8":
            return d
        low = (d.quant_low_format, d.quant_hot_fraction) if d.quant_low_format != "none" else ("fp8", 0.0)
        return replace(d, dense_format="fp8", quant_low_format=low[0], quant_hot_fraction=low[1])

    def memory(self, d: Deployment, w: SimWorkload | None = None) -> RankMemory:
        """One rank's memory running workload w (default the run's: the memory rule's most in flight)."""
        if d.prefill_workers:  # disaggregated (disagg.py): the fuller of its two workers
            return max((self.memory(x, w) for x in disagg.workers(d)), key=lambda r: r.total)
        d, w = self.stored(d), w or self.src.workload
        m = tp_costs.tp_model(self.src.model, d)  # one rank's share under tensor parallelism
        per_expert = expert_bytes(self.src.loads, m.expert_weights, self.b, d.quant_low_format,
                                  d.quant_hot_fraction, m.D, self.src.model.weight_format).mean()
        memory = mesh_costs.memory if d.attn_dp else rank_memory  # a general mesh: one GPU of it (mesh.py)
        return memory(m, d, w, self.b, float(per_expert), precision(d, self.hw, self.b))

    def spec_plan(self, d: Deployment) -> "spec_costs.SpecPlan | None":
        """The speculation priced for d (cost/speculative.py): measured acceptance first, else assumed."""
        return spec_costs.make_plan(d.speculative, self.src.speculative, self.spec_acceptance)

    def spec_reason(self, d: Deployment) -> str | None:
        """Why d's speculation cannot be priced (no acceptance known), or None."""
        return spec_costs.plan_reason(d.speculative, self.src.speculative, self.spec_acceptance)

    def memory_reason(self, d: Deployment) -> str | None:
        return memory_reason(self.memory(d), self.hw, gpus(d))

    def evaluate(self, d: Deployment, workload: SimWorkload | None = None) -> Metrics:
        """One replica priced (its share of the workload), carried to all of them (replicas.py)."""
        total, d = workload or self.src.workload, self.stored(d)
        if total.find_load:  # the highest concurrency meeting the SLOs, each probe priced as below
            return evaluate_at_slo(lambda w: self.evaluate(d, w), total, load_cap(d), self.load_hints, load_key(d))
        one = self._evaluate_replica if not d.prefill_workers else partial(disagg.evaluate, self)  # P/D: disagg.py
        return over_replicas(one(d, replica_workload(total, d.replicas)), total, d.replicas, self.hw.max_ranks)

    def _evaluate_replica(self, d: Deployment, w: SimWorkload) -> Metrics:
        if w.mode == "rate" and not d.attn_dp:  # arrivals by the clock: scheduled and priced step by step
            sched, step_s, phases, detail = self._price_open(d, w, self.prepare(d))
            arrival = poisson_arrivals(w.num_requests, w.rate, w.seed)
        else:  # a general mesh (mesh.py): the schedule over its attention groups
            sched = self.schedule(mesh_costs.attention_view(d) if d.attn_dp else d, w)
            step_s, phases, detail = self.price_schedule(d, sched)
            starts = np.cumsum(step_s) - step_s  # [S] each step's start
            arrival = None if w.mode == "burst" else starts[sched.arrive_step]
        return self._metrics(d, w, sched, step_s, phases, detail, arrival)

    def price_schedule(self, d: Deployment, s: Schedule):
        """(step_s [S], phase lines, detail) of schedule s on d's mesh (a general one: mesh.py)."""
        prep = self.prepare(mesh_costs.expert_view(d) if d.attn_dp else d)
        return mesh_costs.price(self, d, s, prep, Totals.empty) if d.attn_dp else self._price(d, s, prep)

    def schedule(self, d: Deployment, w: SimWorkload) -> Schedule:
        plan = self.spec_plan(d)
        key = (d.ep_size, d.max_num_seqs, d.max_num_batched_tokens, w, plan, self.reference)
        if key not in self._schedules:
            if len(self._schedules) >= 64:  # a long study visits hundreds of (R, seqs, tokens): the oldest leave
                self._schedules.pop(next(iter(self._schedules)))
            self._schedules[key] = (simulate_schedule(w, d.ep_size, d.max_num_seqs, d.max_num_batched_tokens,
                                                      self.chunked, plan) if self.reference or plan is not None
                                    else compiled_schedule(w, d.ep_size, d.max_num_seqs, d.max_num_batched_tokens,
                                                           self.chunked))  # the same, compiled (schedule_fast.py)
        return self._schedules[key]

    def prepare(self, d: Deployment) -> Prepared:
        from moetune.moe.placement import make_placement

        m, R = self.src.model, d.ep_size
        layers = list(range(m.Lm))
        loads = self.src.loads if d.placement == "eplb" else None  # the engine's policies place without loads
        nodes = max(1, R // min(R, self.hw.ranks_per_node))
        if d.placement in ("contiguous", "round_robin", "eplb"):
            key = (d.placement, m.E, R, m.Lm, d.redundant_experts, nodes if R % nodes == 0 else 1)
            if key not in self._placements:  # the same for every trial with these knobs (loads: the trace's)
                self._placements[key] = make_placement(d.placement, m.E, R, layers, d.redundant_experts, loads,
                                                       num_nodes=key[-1])
            p = self._placements[key]
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
        order = np.argsort(phy2log, axis=1, kind="stable")  # [Lm, P] slots grouped by expert, in slot order
        grouped = np.take_along_axis(phy2log, order, axis=1)
        starts = np.maximum.accumulate(np.where(np.diff(grouped, axis=1, prepend=-1) != 0, np.arange(P), 0), axis=1)
        replica_idx = np.zeros_like(phy2log)
        np.put_along_axis(replica_idx, order, np.arange(P) - starts, axis=1)  # the slot's replica number
        to_rank = np.zeros((m.Lm, m.E, R))
        np.add.at(to_rank, (np.arange(m.Lm)[:, None], phy2log, slot_rank[None, :]), 1.0 / reps_slot)
        low_format, hot = ((d.quant_low_format, d.quant_hot_fraction) if self.own_path(d) is None
                           else ("none", 0.0))  # its own path timed: priced as fp32, × the measured ratio
        eb = expert_bytes(self.src.loads, m.expert_weights, self.b, low_format, hot, m.D, m.weight_format)
        slot_bytes = np.take_along_axis(eb, phy2log, axis=1)
        full = m.expert_weights * bytes_per_weight(m.weight_format, self.b, m.D)  # the checkpoint's own precision
        low = (slot_bytes < full - 1e-6).astype(np.float64)
        fp8 = np.where(low > 0, float(low_format == "fp8"), float(m.weight_format == "fp8"))  # at the fp8 rate
        return Prepared(phy2log, slot_rank, replica_idx, reps_slot, to_rank, slot_bytes, low, fp8)

    # ---- pricing --------------------------------------------------------------------------------

    def price_as(self, kind: str, launch_s: float) -> None:
        """The step kind (prefill | decode: which fitted multipliers) and CPU seconds per eager launch
        of the steps priced next (vector_price.py sets them per group of steps)."""
        self._kind, self._launch_s = kind, launch_s

    @property
    def launch_now(self) -> float:
        return self._launch_s

    def roof(self, flops, nbytes, calls, ranks: int, phase: str):
        """Roofline + call overhead, slowed by CPU sharing when more ranks than cores run here."""
        hw, ranks = self.hw, ranks * self.group
        share = max(1.0, ranks / hw.ranks_per_node) if hw.name == "this-machine" else 1.0
        k = self.k.get(f"{phase}/{self._kind}", self.k.get(phase, 1.0))
        compute = flops / (hw.rank_flops(ranks) * hw.gemm_eff)
        memory = nbytes / (hw.mem_bw * hw.mem_eff)
        overhead = calls * hw.op_overhead_s * k
        t = (np.maximum(compute, memory) + overhead) * share
        if self._launch_s:  # launched eagerly: the CPU launching kernels bounds the phase from below
            t = np.maximum(t, calls * self._launch_s * share)
        if self.terms is not None:
            from moetune.search.cost.explain import note_terms

            note_terms(self.terms, (self._kind, phase), flops=flops, bytes=nbytes, calls=calls, k=k,
                       compute_s=compute, memory_s=memory, roof_s=np.maximum(compute, memory), overhead_s=overhead,
                       share=share, seconds=t)
        return t

    def _measure_link(self, ranks: int) -> None:
        """this-machine's collective latency, measured the first time a multi-rank deployment is priced
        (local gloo processes: a few seconds; it depends on how busy the machine is, so it is not assumed)."""
        from moetune.search.cost.hardware import collective_latency

        if self.hw.name != "this-machine" or self._link_measured:
            return
        n = min(ranks, max(self.hw.ranks_per_node, 2))
        lat = self.cal.link_latency(n) if self.cal is not None else collective_latency(n)
        self.hw = replace(self.hw, intra_latency_s=lat, inter_latency_s=lat,
                          source=self.hw.source + f"; gloo all-to-all latency measured: {lat * 1e6:.0f} µs")
        self._link_measured = True

    def rank_view(self, d: Deployment) -> "Simulator":
        """This simulator pricing one rank's shapes under d's tensor parallelism (itself without TP)."""
        if tp_costs.group_size(d) == 1:
            return self
        from copy import copy
        from dataclasses import replace

        view = copy(self)
        view.src = replace(self.src, model=tp_costs.tp_model(self.src.model, d))
        view.group = tp_costs.group_size(d)
        return view

    def tp_latency(self, d: Deployment) -> float:
        """One small all-reduce in a TP group: measured among G local gloo ranks on this-machine
        (once per G), the hardware's intra-node collective latency elsewhere."""
        G = tp_costs.group_size(d)
        if self.hw.name != "this-machine":
            return self.hw.intra_latency_s
        if G not in self._allreduce_s:
            self._allreduce_s[G] = tp_costs.allreduce_latency(G)
        return self._allreduce_s[G]

    def _price(self, d: Deployment, s: Schedule, prep: Prepared):
        """Every lock-step priced piece by piece (phase_costs.py) on one rank's shapes (`rank_view`),
        then added up (`step_totals.add_step`), plus the tensor-parallel collectives (tp.py)."""
        ctx = self.pricing(d)
        totals = Totals.empty(s.num_steps, self.src.model.Lm, d.ep_size, ctx.tp_lat > 0, d.capacity_policy,
                              ctx.spec is not None, bool(d.overlap and d.ep_size > 1))
        if vector_reason(self, d) is None:  # every step at once (vector.py), else the loop below
            offload = price_all(self, d, s, prep, totals, ctx)
            return totals.step_s, totals.phases, totals.detail(d.ep_size, offload)
        for t in range(s.num_steps):
            self._price_step(d, s, t, prep, totals, ctx)
            if self.on_step is not None:
                self.on_step(t + 1, s.num_steps)
        return totals.step_s, totals.phases, totals.detail(d.ep_size, ctx.offload)

    def _price_open(self, d: Deployment, w: SimWorkload, prep: Prepared):
        """A `rate` workload: requests join when the clock passes their Poisson arrival; a gap with no
        work is an idle step (no tokens, its seconds only)."""
        arrivals = poisson_arrivals(w.num_requests, w.rate, w.seed)  # [n]
        ctx = self.pricing(d)
        rp = Replay(w, d.ep_size, d.max_num_seqs, d.max_num_batched_tokens, self.chunked, ctx.spec)
        one = Totals.empty(1, self.src.model.Lm, d.ep_size, ctx.tp_lat > 0,  # step t priced into row 0, then copied out
                           d.capacity_policy, ctx.spec is not None,
                           bool(d.overlap and d.ep_size > 1))
        names = tuple(one.phases)
        step_s, lines, clock, n = [], {p: [] for p in names}, 0.0, w.num_requests
        while rp.arrived < n or rp.has_work():
            while rp.arrived < n and arrivals[rp.arrived] <= clock:
                rp.arrive(rp.arrived)
            if not rp.has_work():
                rp.idle()
                step_s.append(float(arrivals[rp.arrived]) - clock)
                for p in names:
                    lines[p].append(0.0)
            else:
                row, _ = rp.step()  # [R, 6]
                self._price_step(d, _one_step(row), 0, prep, one, ctx)
                step_s.append(float(one.step_s[0]))
                for p in names:
                    lines[p].append(float(one.phases[p][0]))
            clock += step_s[-1]
            if self.on_step is not None:
                self.on_step(len(step_s), None)  # the number of steps is known only at the end
        totals = replace(one, step_s=np.array(step_s), phases={p: np.array(v) for p, v in lines.items()})
        return rp.schedule(), totals.step_s, totals.phases, totals.detail(d.ep_size, ctx.offload)

    def path_factor(self, d: Deployment) -> float:
        """this-machine's factor of the deployment's path over the probed phases: fused decode layers
        at one rank without a capacity, the unfused path otherwise; × the variant's own measured ratio
        over the fp32 path (quant / offload, `own_path`), or, on R expert-parallel ranks, the ranks'
        own compute factor measured on R processes of one thread each."""
        own = self.own_path(d)
        if own is not None and own[0] in ("ep", "tp") and f"compute/{self._kind}" in own[1]:
            return own[1][f"compute/{self._kind}"].value
        fused = (d.ep_size * tp_costs.group_size(d) == 1 and d.capacity_policy not in CAPACITY_PRICED
                 and _verify_fused(d))
        factor = self.cal.path_factor(self._kind, 1 if fused else 2)
        if own is not None and own[0] == "variant" and self._kind in own[1]:
            factor *= own[1][self._kind].value
        return factor

    def own_path(self, d: Deployment):
        """this-machine: ("variant", rates) for a one-rank quant / offload deployment, ("ep", rates) for
        R > 1 expert-parallel ranks (no TP), ("tp", rates) for one tensor-parallel group of G > 1 ranks
        (no EP), each from its own microbenchmark (calibrate.py, measured the
        first time it is needed, then cached); None where the base calibration covers the path."""
        if self.cal is None or self.config_of is None or self.base_config is None or self.cal.source != "microbenchmarks":
            return None
        from moetune.search.cost import calibrate as cal_mod

        probed = {k: r.value for k, r in self.cal.rates_of("step").items()}
        if d.ep_size == 1 and tp_costs.group_size(d) > 1:
            return "tp", self.cal.ensure(cal_mod.tp_key(d), lambda: cal_mod.tp_rates(
                self.base_config, cal_mod.bench_plan(self.cal), d.tp_size, d.expert_tp_size, probed))
        if d.ep_size > 1 and tp_costs.group_size(d) == 1:
            return "ep", self.cal.ensure(f"ep/R{d.ep_size}", lambda: cal_mod.ep_rates(
                self.base_config, cal_mod.bench_plan(self.cal), d.ep_size, probed))
        key = cal_mod.variant_key(d)
        if d.ep_size == 1 and tp_costs.group_size(d) == 1 and key is not None:
            return "variant", self.cal.ensure(f"variant/{key}", lambda: cal_mod.variant_rates(
                self.base_config, self.config_of(d), cal_mod.bench_plan(self.cal)))
        return None

    def pricing(self, d: Deployment) -> "Pricing":
        if d.ep_size > 1:
            self._measure_link(d.ep_size)
        m = self.src.model
        offload = (OffloadState(max(1, resident_slots(d, m.E)),
                   d.offload_eviction, d.offload_prefetch_depth) if d.offload_resident_fraction < 1 else None)
        tp_lat = self.tp_latency(d) if tp_costs.group_size(d) > 1 else 0.0
        own = self.own_path(d) if self.cal is not None else None
        # a TP group timed on its own: its compute factor is over the whole model's one-rank path
        view = self if own is not None and own[0] == "tp" else self.rank_view(d)
        prec = precision(d, self.hw, self.b)
        if own is not None and own[0] == "variant":  # timed on its own path: priced as fp32 × its ratio
            prec = replace(prec, dense_b=float(self.b))
        self.prec = view.prec = prec
        self.measured = view.measured = op_tables.bind(self.tables, m, view.src.model, d, prec,
                                                       self.hw.ranks_per_node)
        plan = self.spec_plan(d)
        draft = self.draft_model(plan.path) if plan is not None and plan.method == "draft" else None
        return Pricing(TraceRows(self.src), offload, costs.Links.of(self.hw, d.ep_size), view, tp_lat, plan, draft)

    def draft_model(self, path: str):
        """The draft checkpoint's SimModel (read once)."""
        if path not in self._draft_models:
            self._draft_models[path] = spec_costs.draft_model_of(path)
        return self._draft_models[path]

    def tp_measured(self, d: Deployment, own, kind: str) -> tuple[float, float | None, float] | None:
        """this-machine, a TP group timed on its own: (all-reduce α, gather α, link B/s) from the measured
        seconds per call at the measured payloads. The B/s is the slope between the two step kinds'
        all-reduces (decode's small payload, prefill's large one: gloo's own per-byte cost here, where
        the memory bandwidth would say far less), the hardware's link figure where the slope is not
        positive; each α is its kind's seconds per call minus the ring's bandwidth term at its payload,
        so each measured size costs exactly what was measured. None where there is no own TP path."""
        if own is None or own[0] != "tp" or f"allreduce/{kind}" not in own[1]:  # GPUs: the all-reduce table's
            return None if self.measured is None else self.measured.tp_link(tp_costs.group_size(d), kind, self.b)
        G, r = tp_costs.group_size(d), own[1]
        ring = 2 * (G - 1) / G
        bw = self.hw.intra_bw * self.hw.link_eff
        pts = [(r[f"allreduce_bytes/{k}"].value, r[f"allreduce/{k}"].value) for k in ("decode", "prefill")
               if f"allreduce/{k}" in r]
        if len(pts) == 2 and pts[1][0] > pts[0][0] and pts[1][1] > pts[0][1]:
            bw = ring * (pts[1][0] - pts[0][0]) / (pts[1][1] - pts[0][1])
        ar = max(r[f"allreduce/{kind}"].value - ring * r[f"allreduce_bytes/{kind}"].value / bw, 0.0)
        ga = (max(r[f"gather/{kind}"].value - (G - 1) / G * r[f"gather_bytes/{kind}"].value / bw, 0.0)
              if f"gather/{kind}" in r else None)
        return ar, ga, bw

    def _price_step(self, d: Deployment, s: Schedule, t: int, prep: Prepared, totals: "Totals",
                    ctx: "Pricing") -> None:
        sim, m, R = ctx.sim, self.src.model, d.ep_size
        sim._kind = "prefill" if s.prefill[t].any() else "decode"
        sim._launch_s = self.launch_s(d, s, t)
        counts = ctx.trace.counts(s, t, m)  # [R, Lm, E]
        whole = costs.StepRows.of(s, t, self.hw.grouped_experts)
        halves = 2 if d.overlap and R > 1 else 1  # two-batch overlap: the MoE layers priced per micro-batch
        st, counts = (whole, counts) if halves == 1 else (whole.half(), counts / 2)
        per_rank = {phase: cost(sim, st) for phase, cost in costs.RANK_PHASES.items()}  # each [R]
        split = (costs.CapacitySplit.of(counts, st.T, d.capacity_factor, m.K, m.E)
                 if d.capacity_policy in CAPACITY_PRICED else None)
        overflow = None
        if split is not None:
            totals.add_capacity(split, counts)
            counts = split.within  # [R, Lm, E] what the first pass sends
            if d.capacity_policy == "buffer":
                overflow, second = costs.overflow_pass(sim, st, split.over, prep, ctx.links)  # [Lm]
                totals.a2a_bytes += second.bytes
                totals.inter_bytes += second.inter_node_bytes
        slots = costs.SlotRows.of(counts, prep, R)
        expert_s = costs.experts(sim, st, slots)  # [Lm, R]
        totals.add_slots(slots, prep)
        stall = costs.offload_stall(sim, ctx.offload, d, per_rank, expert_s, slots, prep)  # [Lm, R]
        own = self.own_path(d) if self.cal is not None else None
        links, step_lat = ctx.links, ctx.links.latency_s
        if own is not None and own[0] == "variant":
            stall = np.zeros_like(stall)  # the store's acquire / copy / evict is in the measured ratio
        elif own is not None and f"exchange/{sim._kind}" in own[1]:  # measured per MoE layer: 3 collectives
            links = replace(links, latency_s=own[1][f"exchange/{sim._kind}"].value / 3)
            step_lat = 0.0  # the lock-step's all-reduce is inside the measured per-rank compute
        a2a = costs.measured_a2a(sim, costs.all_to_all(sim, counts, prep, links), st.T, st.prefill)
        stream = costs.second_stream(costs.engine_of(self), st.T.max(), graph_step(d, s, t), R > 1 and sim.group == 1)
        expert_s = costs.shared_beside_experts(sim, per_rank, expert_s, a2a, stream)
        totals.a2a_bytes += a2a.bytes * halves
        totals.inter_bytes += a2a.inter_node_bytes * halves
        if halves == 2:
            totals.add_slots(slots, prep)  # the other micro-batch's rows
            overlapped(totals, t, per_rank, expert_s, stall, a2a, costs.dense_mlp(sim, whole),
                        costs.other(sim, whole, step_lat), len(m.dense_I), overflow)
        else:
            add_step(totals, t, per_rank, expert_s, stall, a2a, costs.dense_mlp(sim, st),
                      costs.other(sim, st, step_lat), len(m.dense_I), overflow)
        if ctx.spec is not None:  # the drafter's own passes (cost/speculative.py), on the step's critical path
            peek = ctx.trace.peek(int(whole.spec_seqs.max()), m)[-1]  # [E] the next decode rows' last MoE layer
            totals.add_line(t, "draft", spec_costs.draft_seconds(sim, ctx.spec, whole, peek, ctx.draft, m))
        if self.cal is not None:  # the deployment's path (fused at one rank, unfused under EP/TP) over the probed one
            keep = ("dispatch", "combine") if own is not None and own[0] == "ep" else ()
            totals.scale_step(t, sim.path_factor(d), keep)
        if ctx.tp_lat:
            lat, gather_lat, bw = (self.tp_measured(d, own, sim._kind)
                                   or (ctx.tp_lat, None, self.hw.intra_bw * self.hw.link_eff))
            totals.add_tp(t, tp_costs.tp_collectives(m, d, float(st.T.max()), float(st.sampled.max()), bw, lat,
                                                     self.b, gather_lat))

    def launch_s(self, d: Deployment, s: Schedule, t: int) -> float:
        """CPU seconds per kernel launched eagerly in step t: 0 where the step replays a CUDA graph
        (decode only, at most cuda_graph_max_bs sequences on every rank) or graphs are not modelled
        (cuda_graph_max_bs −1, or a hardware without an eager launch figure)."""
        if d.cuda_graph_max_bs < 0 or not self.hw.eager_launch_s or graph_step(d, s, t):
            return 0.0
        return self.hw.eager_launch_s

    def _metrics(self, d: Deployment, w: SimWorkload, s: Schedule, step_s: np.ndarray, phases: dict,
                 detail: dict, arrival_s: np.ndarray | None) -> Metrics:
        mem = self.memory(d, w)  # at the load priced (a search's trials table and simulate --recipe agree)
        detail = {**detail, "memory": mem.as_dict(), "steps": int(s.num_steps),
                  "routing": self.src.scale_routing or "trace",  # which routing was replayed (balance.py)
                  "stored_weights": self.src.model.weight_format}  # fp8: the checkpoint's own, priced as stored
        detail.update(op_tables.trial_figures(self.tables, self.measured, phases))
        plan = self.spec_plan(d)
        if plan is not None:
            detail["speculative"] = {**plan.as_dict(), "draft_s": float(phases.get("draft", np.zeros(1)).sum())}
        return summarize_steps(True, gpus(d), w, s.prefill.sum(1), s.decode.sum(1),
                               s.sampled.sum(1), step_s, s.first_step, s.last_step, mem.total, phases, detail, arrival_s)


@dataclass
class Pricing:
    """What pricing carries from step to step: the trace cursor, the offload cache, the links, the rank view."""

    trace: "TraceRows"
    offload: OffloadState | None
    links: costs.Links
    sim: "Simulator"  # one rank's view (rank_view: its TP shapes)
    tp_lat: float  # the TP group's all-reduce latency (0: no TP)
    spec: "spec_costs.SpecPlan | None" = None  # speculative decoding priced (None: plain decodes)
    draft: object = None  # the draft checkpoint's SimModel (draft:DIR:K)


def _one_step(row: np.ndarray) -> Schedule:
    """A one-step Schedule of an [R, 6] row (what the per-step pricing reads)."""
    none = np.zeros(0, dtype=np.int64)
    return Schedule(*(row[None, :, k] for k in range(6)), none, none, None, row[None, :, 6], row[None, :, 7])


def _verify_fused(d: Deployment) -> bool:
    """Whether d's decode steps run the fused decode layers as far as speculation goes: always
    without it; with it, when a full verify step (max_num_seqs × (1 + k) rows) fits FUSED_ROWS."""
    from moetune.model.fused_decode import FUSED_ROWS

    knob = spec_costs.parse_knob(d.speculative)
    return knob is None or d.max_num_seqs * (1 + knob[1]) <= FUSED_ROWS
