"""The cost of each piece of one lock-step, keyed by the phase vocabulary (docs/architecture.md §2):
the per-rank phases that run once per MoE layer (`RANK_PHASES`), the experts on the ranks holding
their slots, the dense layers' MLPs, `other` (the LM head and the engine's per-step calls), the
all-to-all of dispatch and combine, and the offload stalls. Formulas: simulate.py's docstring.

Each function takes the `Simulator` (its model, hardware, activation bytes and `roof`) and returns
seconds per rank ([R]) or per MoE layer and rank ([Lm, R]); simulate.py adds them up into a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# torch calls per phase and layer: (fixed, per sequence in the step); "step" is once per step.
CALLS = {
    "attention": (22, 6), "router": (8, 0), "permute": (10, 0), "dispatch": (4, 0), "combine": (3, 0),
    "unpermute": (5, 0), "shared_expert": (4, 0), "dense_mlp": (4, 0), "experts_fixed": (3, 0),
    "expert_slot": (5, 0), "step": (60, 12), "lm_head": (4, 1),
}


@dataclass
class StepRows:
    """One lock-step as the cost functions see it, per rank."""

    T: np.ndarray  # [R] tokens computed (prompt + decode); [S, R] over every step (vector.py)
    B: np.ndarray  # [R] sequences, for per-sequence calls (0 with fused kernels: no per-sequence calls)
    pairs: np.ndarray  # [R] attention (query, key) pairs
    context: np.ndarray  # [R] KV tokens read
    sampled: np.ndarray  # [R] rows through the LM head (the tokens sampled; a verify's 1 + j rows each)
    R: int
    spec_seqs: np.ndarray | None = None  # [R] decoding sequences that verified a draft (speculative.py)
    prefill: np.ndarray | None = None  # [R] of T, the prompt tokens (measured attention: op_tables.py)

    @classmethod
    def of(cls, s, t: int, grouped_experts: bool) -> "StepRows":
        T = (s.prefill[t] + s.decode[t]).astype(np.float64)
        B = s.seqs[t].astype(np.float64) * (0.0 if grouped_experts else 1.0)
        head = s.sampled[t] if s.logits is None else s.logits[t]
        drafting = np.zeros_like(T) if s.drafting is None else s.drafting[t].astype(np.float64)
        return cls(T, B, s.pairs[t], s.context[t], head.astype(np.float64), T.shape[-1], drafting,
                   s.prefill[t].astype(np.float64))

    def take(self, idx) -> "StepRows":
        """These steps' rows (fields [S, R] indexed by idx along the steps)."""
        return StepRows(self.T[idx], self.B[idx], self.pairs[idx], self.context[idx], self.sampled[idx], self.R,
                        None if self.spec_seqs is None else self.spec_seqs[idx],
                        None if self.prefill is None else self.prefill[idx])

    def half(self) -> "StepRows":
        """One of two micro-batches: half of every rank's rows, pairs and context (overlap.py)."""
        return StepRows(self.T / 2, self.B / 2, self.pairs / 2, self.context / 2, self.sampled / 2, self.R,
                        None if self.spec_seqs is None else self.spec_seqs / 2,
                        None if self.prefill is None else self.prefill / 2)


@dataclass
class SlotRows:
    """Where the step's copies land: per MoE layer and physical slot, then per rank holding the slots."""

    active: np.ndarray  # [Lm, P] the slot computes rows this step
    slot_rows: np.ndarray  # [Lm, P] rows per slot (a replicated expert's copies split evenly)
    rows_q: np.ndarray  # [Lm, R] rows each rank computes
    act_bytes_q: np.ndarray  # [Lm, R] weight bytes of each rank's active slots
    act_n_q: np.ndarray  # [Lm, R] active slots per rank
    fp8_rows_q: np.ndarray  # [Lm, R] of rows_q, those on fp8 slots (computed at the fp8 rate: Prepared.fp8_slot)
    low_rows_q: np.ndarray  # [Lm, R] of rows_q, those on low-format slots (a mixed expert op: op_tables.py)

    @classmethod
    def of(cls, counts: np.ndarray, prep, R: int) -> "SlotRows":
        """counts: [R, Lm, E] copies per expert from each source rank."""
        return cls.of_total(counts.sum(0), prep, R)

    @classmethod
    def of_total(cls, total: np.ndarray, prep, R: int) -> "SlotRows":
        """total: [..., Lm, E] copies per expert from every rank together (each field [..., Lm, P | R])."""
        index = np.broadcast_to(prep.phy2log, total.shape[:-1] + prep.phy2log.shape[-1:])
        slot_counts = np.take_along_axis(total, index, axis=-1)  # [..., Lm, P]
        active = slot_counts > prep.replica_idx  # [Lm, P]
        slot_rows = slot_counts / prep.reps_slot
        return cls(active, slot_rows, per_rank(slot_rows, R), per_rank(active * prep.slot_bytes, R),
                   per_rank(active.astype(np.float64), R), per_rank(slot_rows * prep.fp8_slot, R),
                   per_rank(slot_rows * prep.low_share_slot, R))


def measured_or(sim, phase: str, roof_s, measure):
    """The phase's seconds from the measured tables (op_tables.py) where the simulator has them bound
    and they hold the op (measure(tables) → seconds or None), else roof_s; each counted with its source."""
    tables = sim.measured
    if tables is None:
        return roof_s
    got = measure(tables)
    if got is None:
        tables.note(phase, 0.0, roof_s, "roofline (no table entry)")
        return roof_s
    got = np.broadcast_to(got, np.shape(roof_s)).astype(np.float64)
    tables.note(phase, got, got, tables.backend.label)
    return got


def in_fused_moe(sim, phase: str, roof_s):
    """permute / unpermute: inside the fused MoE kernel where the experts are measured (0 s), else roof_s."""
    tables = sim.measured
    if tables is None or not tables.experts_measured():
        return roof_s
    tables.note(phase, 0.0, 0.0, "inside the measured fused MoE")
    return np.zeros(np.shape(roof_s))


def attention(sim, st: StepRows) -> np.ndarray:
    m, b, p = sim.src.model, sim.b, sim.prec
    T, B = st.T, st.B
    roof_s = sim.roof(2 * T * m.attn_weights * p.dense_k + m.pair_flops * st.pairs,
                      np.where(T > 0, m.attn_weights * p.dense_b + st.context * m.kv_elems * p.kv_b + 2 * T * m.D * b, 0),
                      np.where(T > 0, CALLS["attention"][0] + CALLS["attention"][1] * B, 2), st.R, "attention")
    prefill = st.prefill if st.prefill is not None else np.zeros_like(T)
    return measured_or(sim, "attention", roof_s, lambda t: t.attention(T, prefill, st.pairs, st.context))


def router(sim, st: StepRows) -> np.ndarray:
    m, b, T = sim.src.model, sim.b, st.T
    roof_s = sim.roof(2 * T * m.D * m.E, m.E * m.D * b + T * m.D * b, CALLS["router"][0], st.R, "router")
    return measured_or(sim, "router", roof_s, lambda t: t.gemm(m.E, m.D, "bfloat16", T))


def permute(sim, st: StepRows) -> np.ndarray:
    m, b, T = sim.src.model, sim.b, st.T
    return in_fused_moe(sim, "permute", sim.roof(0 * T, 2 * T * m.K * m.D * b, CALLS["permute"][0], st.R, "permute"))


def unpermute(sim, st: StepRows) -> np.ndarray:
    m, b, T = sim.src.model, sim.b, st.T
    return in_fused_moe(sim, "unpermute", sim.roof(2 * T * m.K * m.D, (T * m.K + T) * m.D * b,
                                                   CALLS["unpermute"][0], st.R, "unpermute"))


def shared_expert(sim, st: StepRows) -> np.ndarray:
    m, b, T, p = sim.src.model, sim.b, st.T, sim.prec
    if not m.I_shared:
        return np.zeros_like(st.T)
    roof_s = sim.roof(6 * T * m.D * m.I_shared * p.dense_k, 3 * m.D * m.I_shared * p.dense_b + 2 * T * m.D * b,
                      CALLS["shared_expert"][0], st.R, "shared_expert")
    return measured_or(sim, "shared_expert", roof_s, lambda t: t.mlp(m.I_shared, T))


# per-rank phases that run once in every MoE layer, each [R] seconds
RANK_PHASES = {"attention": attention, "router": router, "permute": permute, "unpermute": unpermute,
               "shared_expert": shared_expert}


def experts(sim, st: StepRows, slots: SlotRows) -> np.ndarray:
    """[Lm, R]: the grouped GEMMs of each rank's active slots."""
    m, b, hw = sim.src.model, sim.b, sim.hw
    calls = CALLS["experts_fixed"][0] + (0 if hw.grouped_experts else CALLS["expert_slot"][0]) * slots.act_n_q
    rows = slots.rows_q if sim.prec.expert_fp8_k == 1.0 else slots.rows_q - (1 - sim.prec.expert_fp8_k) * slots.fp8_rows_q
    roof_s = sim.roof(6 * rows * m.D * m.I, slots.act_bytes_q + 2 * slots.rows_q * m.D * b, calls, st.R,
                      "experts")
    return measured_or(sim, "experts", roof_s, lambda t: t.experts(slots.rows_q, slots.low_rows_q))


STREAM_TOKENS = 256  # vLLM's VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (its default)
BESIDE = ("beside the routed path where the engine runs it on a second stream (vLLM: steps of at most 256 "
          "shared-expert rows a GPU; SGLang: CUDA-graph steps, every step under DeepEP), else serial")


def engine_of(sim) -> str:
    """Whose kernels and schedule price the step: --engine's tables (vllm where none were chosen)."""
    return sim.tables.engine if getattr(sim, "tables", None) is not None else "vllm"


def second_stream(engine: str, rows, graph, a2a: bool) -> np.ndarray:
    """[...] bool: the steps whose shared expert the engine runs on a second stream beside the routed path.
    vLLM (SharedExperts' MULTI_STREAM_OVERLAPPED) only where the GPU's shared-expert rows are at most
    VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (256; a larger step runs it serially); SGLang under DeepEP in
    every step (its alt stream beside dispatch), else only in the steps replayed from a CUDA graph (its
    dual-stream MoE is taken in capture mode). rows: [...] each step's largest shared-expert rows a GPU;
    graph: [...] the step replays a CUDA graph; a2a: the deployment dispatches all-to-all (DeepEP)."""
    if engine == "sglang":
        return np.broadcast_to(np.asarray(graph, dtype=bool) | a2a, np.shape(rows))
    return np.asarray(rows) <= STREAM_TOKENS


def shared_beside_experts(sim, per_rank: dict, expert_s: np.ndarray, a2a: "AllToAll",
                          stream: np.ndarray | None = None) -> np.ndarray:
    """With the measured tables bound (the engines' kernels in the engines' schedule), the shared expert
    runs on a second stream beside the routed path — dispatch, routed experts, combine (vLLM's
    SharedFusedMoE, SGLang's alternate stream), as the peer prices its decode steps: each rank's expert time
    becomes max(routed, shared − dispatch − combine) and the shared-expert line 0 (in place on per_rank),
    in the steps `stream` ([...] bool, `second_stream`; None: every step) says; the others keep it serial.
    expert_s: [..., Lm, R], a2a's seconds [..., Lm]; returns the new expert_s. per_rank's ranks are
    expert_s's, or (a general mesh, cost/mesh.py: [..., a] attention groups beside [..., Lm, e] expert
    ranks) every GPU runs the shared expert on the same rows: then their largest stands beside each rank."""
    shared = per_rank["shared_expert"]  # [..., R] (or [..., a])
    on = np.ones(shared.shape[:-1], bool) if stream is None else np.broadcast_to(stream, shared.shape[:-1])
    if sim.measured is None or not np.any(shared) or not on.any():
        return expert_s
    sim.measured.sources["shared_expert"] = BESIDE
    per_rank["shared_expert"] = shared * ~on[..., None]
    comm = (np.asarray(a2a.dispatch) + np.asarray(a2a.combine))[..., None]  # [..., Lm, 1]
    same = shared.shape[-1] == expert_s.shape[-1]
    beside = shared[..., None, :] if same else shared.max(-1)[..., None, None]  # [..., 1, R | 1]
    return np.where(on[..., None, None], np.maximum(expert_s, beside - comm), expert_s)


@dataclass
class CapacitySplit:
    """A step's copies under a per-expert capacity (moe/capacity.py): each source rank r keeps at most
    C_r = ceil(factor · T_r · K / E) copies per logical expert (T_r: its tokens in the step)."""

    within: np.ndarray  # [R, Lm, E] copies in the first pass (the only one under `drop`)
    over: np.ndarray  # [R, Lm, E] copies beyond capacity: not computed (`drop`) or the second pass (`buffer`)

    @classmethod
    def of(cls, counts: np.ndarray, T: np.ndarray, factor: float, K: int, E: int) -> "CapacitySplit":
        cap = np.ceil(factor * T * K / E)  # [R] as the engine's capacity_of (math.ceil of the same product)
        within = np.minimum(counts, cap[:, None, None])
        return cls(within, counts - within)


def overflow_pass(sim, st: StepRows, over: np.ndarray, prep, links: "Links") -> tuple[np.ndarray, "AllToAll"]:
    """[Lm] seconds of `buffer`'s second pass in every MoE layer (moe/passes.py; the engine runs it
    even when empty, so its calls are paid every layer): permute of the source rank's overflow copies
    (K = 1), their dispatch, the experts' GEMMs on the overflow rows (weights read again), combine.
    over: [R, Lm, E] copies beyond capacity per source rank."""
    m, b = sim.src.model, sim.b
    src_rows = over.sum(2).T  # [Lm, R] overflow copies each rank sends
    permute_s = sim.roof(0 * src_rows, 2 * src_rows * m.D * b, CALLS["permute"][0], st.R, "permute")  # [Lm, R]
    slots = SlotRows.of(over, prep, st.R)
    a2a = all_to_all(sim, over, prep, links)
    return permute_s.max(1) + a2a.dispatch + experts(sim, st, slots).max(1) + a2a.combine, a2a


def dense_mlp(sim, st: StepRows) -> np.ndarray:
    """[R]: the MLPs of every dense layer (0 without dense layers)."""
    m, b, T, p = sim.src.model, sim.b, st.T, sim.prec
    if not m.dense_I:
        return np.zeros_like(st.T)
    return sum(measured_or(sim, "dense_mlp", sim.roof(6 * T * m.D * i * p.dense_k, 3 * m.D * i * p.dense_b
                                                      + 2 * T * m.D * b, CALLS["dense_mlp"][0], st.R, "dense_mlp"),
                           lambda t, i=i: t.mlp(i, T))
               for i in m.dense_I)


def other(sim, st: StepRows, collective_s: float) -> np.ndarray:
    """[R]: the LM head on the sampled rows and the engine's per-step calls, plus the lock-step
    all-reduce ("anything left?") with several ranks."""
    m, b, sampled, B = sim.src.model, sim.b, st.sampled, st.B
    out = sim.roof(2 * sampled * m.D * m.V, np.where(sampled > 0, m.D * m.V * b, 0),
                   CALLS["lm_head"][0] + CALLS["lm_head"][1] * np.minimum(sampled, B) + CALLS["step"][0]
                   + CALLS["step"][1] * B, st.R, "other")
    if sim.measured is not None:  # the LM head from the GEMM table, the engine's per-step calls as the roofline's
        calls = sim.roof(0 * sampled, 0 * sampled, CALLS["step"][0] + CALLS["step"][1] * B, st.R, "other")
        out = measured_or(sim, "other", out, lambda t: None if (g := t.gemm(m.V, m.D, "bfloat16", sampled)) is None
                          else g + calls)
    return out + (collective_s if st.R > 1 else 0.0)


@dataclass
class Links:
    """Which pairs of ranks share a node, and the latency of one collective among them."""

    same_node: np.ndarray  # [R, R] bool, the diagonal excluded
    other_node: np.ndarray  # [R, R] bool
    latency_s: float

    @classmethod
    def of(cls, hw, R: int) -> "Links":
        node = np.arange(R) // min(R, hw.ranks_per_node)
        same = (node[:, None] == node[None, :]) & ~np.eye(R, dtype=bool)
        other_node = node[:, None] != node[None, :]
        return cls(same, other_node, hw.inter_latency_s if other_node.any() else hw.intra_latency_s)


@dataclass
class AllToAll:
    dispatch: np.ndarray  # [Lm] seconds (the split sizes are exchanged first: one more collective)
    combine: np.ndarray  # [Lm] seconds
    bytes: float  # both ways, every rank
    inter_node_bytes: float


def all_to_all(sim, counts: np.ndarray, prep, links: Links) -> AllToAll:
    """Dispatch and combine of every MoE layer: each lasts as long as its slowest rank's link."""
    m, b, hw = sim.src.model, sim.b, sim.hw
    R = counts.shape[0]
    if R == 1:
        none = np.zeros(m.Lm)
        return AllToAll(none, none, 0.0, 0.0)
    copies = np.matmul(counts.transpose(1, 0, 2), prep.to_rank).transpose(1, 0, 2)  # [R, Lm, R] r → q
    row_bytes = m.D * b
    intra = (copies * links.same_node[:, None, :]).sum(2) * row_bytes  # [R, Lm] sent in node
    inter = (copies * links.other_node[:, None, :]).sum(2) * row_bytes
    intra_in = (copies * links.same_node[:, None, :]).sum(0).T * row_bytes  # [R, Lm] received
    inter_in = (copies * links.other_node[:, None, :]).sum(0).T * row_bytes
    link = (np.maximum(intra, intra_in) / (hw.intra_bw * hw.link_eff)
            + np.maximum(inter, inter_in) / (hw.inter_bw * hw.link_eff))  # [R, Lm]
    a2a = link.max(0) + CALLS["dispatch"][0] * hw.op_overhead_s  # [Lm] the rows, either way
    lat = links.latency_s
    return AllToAll(a2a + 2 * lat, a2a + lat, 2 * float((intra + inter).sum()), 2 * float(inter.sum()))


def measured_a2a(sim, a2a: AllToAll, T: np.ndarray, prefill: np.ndarray | None) -> AllToAll:
    """a2a with its dispatch / combine seconds from the measured tables (op_tables.py) at the largest
    rank's tokens, where bound and held; the bytes stay the trace's. T, prefill: [..., R] tokens and
    prompt tokens per rank."""
    tables = sim.measured
    if tables is None or T.shape[-1] == 1:
        return a2a
    got = tables.dispatch(T.max(-1), (prefill if prefill is not None else 0 * T).max(-1) > 0)
    if got is None:
        for phase, s in (("dispatch", a2a.dispatch), ("combine", a2a.combine)):
            tables.note(phase, 0.0, s, "roofline (no table entry)")
        return a2a
    shape = np.shape(a2a.dispatch)
    dispatch, combine = (np.broadcast_to(np.asarray(x)[..., None], shape).astype(np.float64) for x in got)
    for phase, s in (("dispatch", dispatch), ("combine", combine)):
        tables.note(phase, s, s, tables.backend.label)
    return AllToAll(dispatch, combine, a2a.bytes, a2a.inter_node_bytes)


def offload_stall(sim, offload, d, per_rank: dict, expert_s: np.ndarray, slots: SlotRows, prep) -> np.ndarray:
    """[Lm, R]: seconds each rank waits at each MoE layer for experts not resident (`offload.py`);
    prefetch hides up to `prefetch_depth` layers of compute. Zero when everything is resident."""
    m, hw = sim.src.model, sim.hw
    R = expert_s.shape[1]
    stall = np.zeros((m.Lm, R))
    if offload is None:
        return stall
    layer_compute = float(per_rank["attention"].max() + per_rank["router"].max() + expert_s.max(1).mean())
    local = prep.phy2log.shape[1] // R
    for q in range(R):
        lo = q * local
        for j in range(m.Lm):
            needed = list(np.nonzero(slots.active[j, lo: lo + local])[0] + lo)
            stall[j, q] = offload.step(q, j, needed, prep.slot_bytes[j], hw.host_bw,
                                       layer_compute * d.offload_prefetch_depth, hw.mem_bw / 2)
    return stall


def per_rank(x: np.ndarray, R: int) -> np.ndarray:
    """[..., Lm, P] → [..., Lm, R] summed over each rank's contiguous slots."""
    return x.reshape(x.shape[:-1] + (R, x.shape[-1] // R)).sum(-1)
