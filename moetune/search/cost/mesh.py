"""Every mesh the serving engines run: attention and experts parallelised independently over the
same N GPUs of a replica (`Deployment.attn_dp > 0`; attn_dp 0 is the mesh simulate.py prices itself).

  attention: a = attn_dp data-parallel groups × t = tp_size tensor-parallel ranks   (a·t = N)
  experts:   e = ep_size expert-parallel ranks × f = expert_tp_size tensor-parallel ranks (e·f = N)

e.g. DP-4 attention with TP-4 experts (a 4, t 1, e 1, f 4); TP-8 attention with EP-8 experts (a 1, t 8,
e 8, f 1); DP-8 attention with TP-2 × EP-4 experts (a 8, t 1, e 4, f 2). Requests are spread over
the a attention groups (the schedule runs on a ranks); each MoE layer of a step is priced as

  layer = max_i(attention + router + permute)_i + moe_in + max_q(experts)_q + moe_out + max_i(unpermute)_i + shared

- attention, router, permute, unpermute, dense MLPs and the LM head: phase_costs on a group's own rows
  at the attention-TP shapes (tp.tp_model with tp_size t: heads, dense intermediate and vocab / t,
  GQA's KV heads / t, MLA's latent whole), plus the attention TP collectives (tp.tp_collectives over t:
  an all-reduce of [T_i, D] per layer and dense MLP, the embedding all-reduce, the LM-head gather);
- experts: phase_costs.experts on each EP rank's slots (the placement over e ranks) from the copies of
  every group's rows (the trace's), at the expert-TP shapes (I / f);
- how tokens reach the experts (`moe_a2a`):
  all-to-all (1; pure EP, f = 1: SGLang `--moe-a2a-backend deepep`, vLLM `--all2all-backend deepep_*`):
    each group's rows leave from its t GPUs, T_i / t each, to the GPU holding each copy's slot
    (phase_costs.all_to_all's link model over N GPUs, NVLink in a node, the inter-node link across);
    the attention output is reduce-scattered and the combined rows all-gathered over t (the same
    bytes as the all-reduce priced among the TP collectives);
  all-gather + reduce-scatter (0; SGLang's default dispatcher, vLLM's allgather_reducescatter):
    moe_in  = (a−1)/a · T·D·b / bw + α                       (every GPU gathers all T = Σ_i T_i rows; a > 1)
    moe_out = (N−1)/N · T·D·b / bw + α  [+ (t−1)/t · max_i T_i·D·b / bw_t + α  when t > 1]
            (the partial sums of every expert shard reduce-scattered over N, then each group's rows
             gathered over its t ranks); at a = 1 (every GPU holds all rows) the one all-reduce of
             [T, D] the TP mesh prices: 2·(N−1)/N · T·D·b / bw + α, no moe_in
- the shared expert, on the rows and weight split each engine gives it (`shared_rows`): vLLM runs it on
  its own group's T_i rows at I_shared / t (SharedFusedMoE takes the group's input before the DP
  dispatch; the MLP is TP-split over the group like a dense one), SGLang's all-gather on all T rows at
  I_shared / N; under all-to-all (and vLLM's sequence-parallel MoE) on the GPU's T_i / t rows, whole.
  With the measured tables bound it runs beside dispatch, routed experts and combine in the steps the
  engine runs it on a second stream (phase_costs.shared_beside_experts / second_stream, as the legacy
  meshes price it); in the other steps, and on the roofline, it adds serially.
- bw: the node's NVLink figure per GPU when the collective's ranks share a node, else the inter-node one.

With the measured tables bound (op_tables.bind to this mesh, the gpu-db extra) every op above is looked up as in
an aggregated trial; moe_in / moe_out come from NCCL's and DeepEP's rows at the step's message sizes
(collective_tables.py) and the attention-TP all-reduces from the custom all-reduce fit (Measured.tp_link),
each formula above staying where the rows lack the collective.

Priced on GPU hardware (the serving engines' meshes; moetune's CPU engine runs only the legacy mesh),
closed-loop and burst workloads, without capacity limits, offloading or speculation: `mesh_reason`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from moetune.search.cost import collective_tables, op_tables
from moetune.search.cost import phase_costs as costs
from moetune.search.cost import tp as tp_costs
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.memory import RankMemory, graph_bytes, rank_memory
from moetune.search.cost.precision import precision
from moetune.search.cost.vector import Windows, all_to_all, half, slots_of
from moetune.search.cost.vector_price import add_steps, graph_steps, launch_all, overlapped, take


def attention_view(d: Deployment) -> Deployment:
    """The legacy deployment whose DP ranks and TP shapes are d's attention groups (experts whole)."""
    return replace(d, ep_size=d.attn_dp, tp_size=d.tp_size, expert_tp_size=1, attn_dp=0, redundant_experts=0,
                   placement="contiguous")


def expert_view(d: Deployment) -> Deployment:
    """The legacy deployment whose EP ranks and expert-TP shapes are d's expert mesh."""
    return replace(d, tp_size=1, attn_dp=0)


def a2a_used(d: Deployment) -> bool:
    return bool(d.moe_a2a) and d.ep_size > 1


def mesh_reason(m, d: Deployment, hw=None, w=None) -> str | None:
    """Why this general mesh cannot run (or, given the hardware and workload, cannot be priced there), or
    None. m: the SimModel."""
    if not d.attn_dp:
        return None
    N = d.ep_size * d.expert_tp_size
    if N % d.attn_dp or d.tp_size * d.attn_dp != N:
        return (f"attention DP {d.attn_dp} × TP {d.tp_size} does not cover the {N} GPUs of experts "
                f"EP {d.ep_size} × TP {d.expert_tp_size}")
    if a2a_used(d) and d.expert_tp_size > 1:
        return (f"an all-to-all dispatch runs pure expert parallelism (the engines' all-to-all backends set EP to "
                f"all {N} GPUs): expert TP {d.expert_tp_size} needs moe_a2a 0")
    split = tp_costs.tp_reason(m, replace(d, tp_size=d.tp_size, expert_tp_size=1)) if d.tp_size > 1 else None
    split = split or (tp_costs.tp_reason(m, replace(d, tp_size=1, expert_tp_size=d.expert_tp_size))
                      if d.expert_tp_size > 1 else None)
    if split:
        return split
    if hw is not None and hw.name == "this-machine":
        return "a general mesh (attn_dp > 0) is priced for GPU serving engines; moetune's CPU engine runs attn_dp 0"
    if d.capacity_policy != "none" or d.offload_resident_fraction < 1 or d.speculative != "none":
        return "a general mesh is priced without capacity limits, offloading and speculation"
    if w is not None and w.mode == "rate":
        return "a general mesh is priced on closed-loop (--concurrency) and burst workloads, not --request-rate"
    return None


def link(hw, ranks: int) -> tuple[float, float]:
    """(bytes/s, α) of a collective among `ranks` GPUs: NVLink inside a node, else the inter-node link."""
    if ranks <= hw.ranks_per_node:
        return hw.intra_bw * hw.link_eff, hw.intra_latency_s
    return hw.inter_bw * hw.link_eff, hw.inter_latency_s


def gather_seconds(d: Deployment, hw, D: int, b: int, T: np.ndarray, T_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([S] moe_in, [S] moe_out) of the all-gather mode (module doc); T: [S] rows of every group, T_max
    [S] the largest group's."""
    a, t, N = d.attn_dp, d.tp_size, d.ep_size * d.expert_tp_size
    bw, lat = link(hw, N)
    row = D * b
    if N == 1:
        return np.zeros_like(T), np.zeros_like(T)
    if a == 1:  # every GPU holds all T rows: the all-reduce of [T, D] (one ring: reduce-scatter + all-gather)
        return np.zeros_like(T), 2 * (N - 1) / N * T * row / bw + lat
    moe_in = (a - 1) / a * T * row / bw + lat
    moe_out = (N - 1) / N * T * row / bw + lat
    if t > 1:
        bw_t, lat_t = link(hw, t)
        moe_out = moe_out + (t - 1) / t * T_max * row / bw_t + lat_t
    return moe_in, moe_out


def shared_split(d: Deployment, engine: str, T: np.ndarray) -> tuple[np.ndarray, int]:
    """([S] rows each GPU runs the shared expert on, the TP split of its weights) as `engine` runs it on
    d's mesh; T: [S, a] each attention group's rows (module doc). vLLM's sequence-parallel MoE (expert
    parallelism with attention TP > 1 and DP > 1: ParallelConfig.use_sequence_parallel_moe) and every
    all-to-all backend (SGLang: the shared MLP at tp_size 1 under DeepEP) split a group's rows over its t
    GPUs and keep the weights whole."""
    a, t, N = d.attn_dp, d.tp_size, d.ep_size * d.expert_tp_size
    if a2a_used(d) or (engine == "vllm" and d.ep_size > 1 and t > 1 and a > 1):
        return T.max(1) / t, 1
    if engine == "sglang":  # the MLP input gathered from every group, the MLP TP-split over all N GPUs
        return T.sum(1), N
    return T.max(1), t  # vLLM: the group's own rows (before the DP dispatch), TP-split over its t GPUs


def sources(sent: np.ndarray, t: int) -> np.ndarray:
    """[S, a, Lm, N] copies group i sends to GPU q → [S, a·t, Lm, N]: each of the group's t GPUs sends 1/t."""
    return np.repeat(sent / t, t, axis=1)


def price(sim, d: Deployment, s, prep, empty):
    """Every step of schedule s (over the attn_dp groups) priced on d's mesh; prep: the placement over
    the ep_size EP ranks (Simulator.prepare of `expert_view`), empty: step_totals.Totals.empty.
    Returns (step_s [S], phase lines, detail)."""
    m, hw, b = sim.src.model, sim.hw, sim.b
    a, t, e = d.attn_dp, d.tp_size, d.ep_size
    N = e * d.expert_tp_size
    halves = 2 if d.overlap and a2a_used(d) else 1
    att, moe = sim.rank_view(attention_view(d)), sim.rank_view(expert_view(d))
    sim.prec = att.prec = moe.prec = precision(d, hw, b)
    # the measured tables bound to this mesh's shapes (attention TP t, experts EP e × TP f), for every view
    sim.measured = att.measured = moe.measured = op_tables.bind(sim.tables, m, att.src.model, d, sim.prec,
                                                                hw.ranks_per_node)
    totals = empty(s.num_steps, m.Lm, e, True, "none", False, halves == 2)
    whole = costs.StepRows.of(s, slice(None), hw.grouped_experts)  # fields [S, a]
    st = whole if halves == 1 else half(whole)
    win = Windows.of(sim, s)
    slots, _ = slots_of(win, prep, e, halves)  # [S, Lm, e] each EP rank's rows, from every group's copies
    engine = costs.engine_of(sim)
    shared_rows, split = shared_split(d, engine, st.T)  # [S] rows a GPU, the MLP's TP split
    shared = sim.rank_view(replace(attention_view(d), tp_size=1, ep_size=1, expert_tp_size=split))  # I_shared / split
    kinds = np.where(s.prefill.any(1), "prefill", "decode")  # [S]
    launch = launch_all(sim, d, s)  # [S]
    pieces = {p: np.zeros(st.T.shape) for p in costs.RANK_PHASES}
    expert_s, dense, other = np.zeros(slots.rows_q.shape), np.zeros(st.T.shape), np.zeros(st.T.shape)
    step_lat = costs.Links.of(hw, a).latency_s  # the lock-step's "anything left?" among the attention groups
    for kind in ("prefill", "decode"):
        for lau in np.unique(launch[kinds == kind]):
            idx = np.nonzero((kinds == kind) & (launch == lau))[0]
            for view in (att, moe, shared):
                view.price_as(kind, float(lau))
            sg, wg = st.take(idx), whole.take(idx)
            for phase, cost in costs.RANK_PHASES.items():
                if phase != "shared_expert":
                    pieces[phase][idx] = cost(att, sg)
            rows = shared_rows[idx][:, None]  # [n, 1]
            none = np.zeros_like(rows)
            pieces["shared_expert"][idx] = costs.shared_expert(shared, costs.StepRows(rows, none, none, none, none, N))
            expert_s[idx] = costs.experts(moe, sg, take(slots, idx))
            dense[idx], other[idx] = costs.dense_mlp(att, wg), costs.other(att, wg, step_lat)
    a2a = _moe_exchange(moe, d, st, win, prep, halves)
    stream = costs.second_stream(engine, shared_rows, graph_steps(d, s), a2a_used(d))  # [S] as simulate.py
    expert_s = costs.shared_beside_experts(sim, pieces, expert_s, a2a, stream)  # with the tables bound
    totals.a2a_bytes += float(a2a.bytes.sum()) * halves
    totals.inter_bytes += float(a2a.inter_node_bytes.sum()) * halves
    totals.rank_rows += halves * slots.rows_q.sum(0)
    totals.low_copies += halves * float(slots.low.sum())
    totals.all_copies += halves * float(slots.all.sum())
    stall = np.zeros(expert_s.shape)
    (overlapped if halves == 2 else add_steps)(totals, pieces, expert_s, stall, a2a, dense, other, len(m.dense_I))
    _attention_tp(sim, d, whole, totals)
    detail = {**totals.detail(e, None), "mesh": {"attn_dp": a, "attn_tp": t, "moe_ep": e, "moe_tp": d.expert_tp_size,
                                                   "moe_a2a": int(a2a_used(d)), "gpus": N}}
    return totals.step_s, totals.phases, detail


def _moe_exchange(moe, d: Deployment, st: costs.StepRows, win: Windows, prep, halves: int) -> costs.AllToAll:
    """[S, Lm] seconds of how each MoE layer's rows reach the experts and come back (module doc)."""
    m, hw, b = moe.src.model, moe.hw, moe.b
    S, N = st.T.shape[0], d.ep_size * d.expert_tp_size
    if a2a_used(d):
        sent = sources(win.sent(prep.to_rank) / halves, d.tp_size)  # [S, N, Lm, N]
        links = costs.Links.of(hw, N)
        roof = all_to_all(moe, sent, links, np.full(S, links.latency_s))
        copies = np.maximum(sent.sum(3), sent.sum(1).transpose(0, 2, 1)).max(1)  # [S, Lm] a GPU's out or in, the most
        prefill = (st.prefill if st.prefill is not None else 0 * st.T).max(1) > 0  # [S]
        return collective_tables.a2a_exchange(moe.measured, d, hw.ranks_per_node, roof, st.T.max(1) / d.tp_size,
                                              copies, prefill)
    T, T_max = st.T.sum(1), st.T.max(1)
    moe_in, moe_out = collective_tables.gather_exchange(moe.measured, d, hw.ranks_per_node, T, T_max,
                                                        *gather_seconds(d, hw, m.D, b, T, T_max))
    a = d.attn_dp
    moved = (((a - 1) / a if a > 1 else 0.0) + ((N - 1) / N if N > 1 else 0.0)) * T * m.D * b * N * m.Lm  # [S]
    inter = moved if N > hw.ranks_per_node else np.zeros(S)
    return costs.AllToAll(np.repeat(moe_in[:, None], m.Lm, 1), np.repeat(moe_out[:, None], m.Lm, 1), moved, inter)


def _attention_tp(sim, d: Deployment, st: costs.StepRows, totals) -> None:
    """Each step's attention-TP collectives over the t ranks of the largest group (tp.tp_collectives)."""
    if d.tp_size == 1:
        return
    m, hw = sim.src.model, sim.hw
    group = replace(d, ep_size=1, expert_tp_size=1, attn_dp=0)
    T, sampled = st.T.max(1), st.sampled.max(1)
    links = {}  # step kind → (α, B/s): the custom all-reduce table's fit (Measured.tp_link), else the roofline
    for kind in ("prefill", "decode"):
        fit = sim.measured.tp_link(d.tp_size, kind, sim.b) if sim.measured is not None else None
        links[kind] = (fit[0], fit[2]) if fit is not None else link(hw, d.tp_size)[::-1]
    kinds = np.where(st.prefill.max(1) > 0, "prefill", "decode") if st.prefill is not None else ["decode"] * len(T)
    for k in range(len(T)):
        lat, bw = links[kinds[k]]
        totals.add_tp(k, tp_costs.tp_collectives(m, group, float(T[k]), float(sampled[k]), bw, lat, sim.b))


def memory(m, d: Deployment, w, b: int, per_expert: float, prec) -> RankMemory:
    """One GPU's memory on d's mesh: m at its shapes (tp.tp_model: attention / t, experts / f); the
    expert slots of one EP rank, the KV cache and activations of one attention group."""
    by_ep = rank_memory(m, replace(d, attn_dp=0), w, b, per_expert, prec)
    by_dp = rank_memory(m, replace(d, attn_dp=0, ep_size=d.attn_dp, redundant_experts=0), w, b, per_expert, prec)
    return RankMemory(by_ep.dense, by_ep.experts, by_dp.kv, by_dp.activations, graph_bytes(replace(d, ep_size=d.attn_dp)))
