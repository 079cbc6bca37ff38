"""Simulator._price over every step at once (vector.py says how): the same pieces as
`Simulator._price_step`, each an array over the steps, added up as `step_totals.add_step` /
`overlapped` add one step's."""

from __future__ import annotations

import numpy as np

from moetune.search.cost import phase_costs as costs
from moetune.search.cost import speculative as spec_costs
from moetune.search.cost import tp as tp_costs
from moetune.search.cost.offload_fast import FastOffload
from moetune.search.cost.overlap import serial_layer, tbo_layer
from moetune.search.cost.vector import Slots, Windows, all_to_all, half, slots_of


def price_all(self, d, s, prep, totals, ctx):
    """Fill `totals` (step_totals.Totals.empty for s) with every step's seconds and phase lines; returns
    the run's offload figures (offload_fast.FastOffload, None without offloading).
    self: the Simulator, ctx: its `pricing(d)` (the pieces are priced on its rank view)."""
    sim, m, R = ctx.sim, self.src.model, d.ep_size
    halves = 2 if d.overlap and R > 1 else 1
    whole = costs.StepRows.of(s, slice(None), self.hw.grouped_experts)  # fields [S, R]
    st = whole if halves == 1 else half(whole)
    win = Windows.of(self, s)
    slots, active = slots_of(win, prep, R, halves, keep_active=ctx.offload is not None)
    own = self.own_path(d) if self.cal is not None else None
    kinds = np.where(s.prefill.any(1), "prefill", "decode")  # [S]
    launch = launch_all(self, d, s)  # [S]
    pieces = {p: np.zeros(st.T.shape) for p in costs.RANK_PHASES}
    expert_s, dense, other = np.zeros(slots.rows_q.shape), np.zeros(st.T.shape), np.zeros(st.T.shape)
    link_lat = np.full(s.num_steps, ctx.links.latency_s)
    for kind in ("prefill", "decode"):
        step_lat = ctx.links.latency_s
        if own is not None and own[0] != "variant" and f"exchange/{kind}" in own[1]:
            link_lat[kinds == kind] = own[1][f"exchange/{kind}"].value / 3
            step_lat = 0.0
        for lau in np.unique(launch[kinds == kind]):
            idx = np.nonzero((kinds == kind) & (launch == lau))[0]
            sim.price_as(kind, float(lau))
            sg, wg = st.take(idx), (whole if halves == 2 else st).take(idx)
            for phase, cost in costs.RANK_PHASES.items():
                pieces[phase][idx] = cost(sim, sg)
            expert_s[idx] = costs.experts(sim, sg, take(slots, idx))
            dense[idx], other[idx] = costs.dense_mlp(sim, wg), costs.other(sim, wg, step_lat)
    stall, offload = offload_stalls(sim, ctx.offload, d, pieces, expert_s, active, prep)
    if own is not None and own[0] == "variant":
        stall = np.zeros_like(stall)
    a2a = costs.measured_a2a(sim, all_to_all(sim, win.sent(prep.to_rank) / halves, ctx.links, link_lat), st.T,
                             st.prefill)
    stream = costs.second_stream(costs.engine_of(self), st.T.max(1), graph_steps(d, s), R > 1 and sim.group == 1)
    expert_s = costs.shared_beside_experts(sim, pieces, expert_s, a2a, stream)
    totals.a2a_bytes += float(a2a.bytes.sum()) * halves
    totals.inter_bytes += float(a2a.inter_node_bytes.sum()) * halves
    totals.rank_rows += halves * slots.rows_q.sum(0)
    totals.low_copies += halves * float(slots.low.sum())
    totals.all_copies += halves * float(slots.all.sum())
    if halves == 2:
        overlapped(totals, pieces, expert_s, stall, a2a, dense, other, len(m.dense_I))
    else:
        add_steps(totals, pieces, expert_s, stall, a2a, dense, other, len(m.dense_I))
    if ctx.spec is not None:
        totals.phases["draft"][:] = draft_lines(sim, ctx, whole, win, kinds, launch, m)
        totals.step_s += totals.phases["draft"]
    if self.cal is not None:
        keep = ("dispatch", "combine") if own is not None and own[0] == "ep" else ()
        for kind in ("prefill", "decode"):
            sim.price_as(kind, sim.launch_now)
            scale(totals, kinds == kind, sim.path_factor(d), keep)
    if ctx.tp_lat:
        tp_lines(self, d, own, ctx, st, kinds, totals)
    if self.on_step is not None:
        self.on_step(s.num_steps, s.num_steps)
    return offload


def launch_all(self, d, s) -> np.ndarray:
    """[S] Simulator.launch_s of every step."""
    if d.cuda_graph_max_bs < 0 or not self.hw.eager_launch_s:
        return np.zeros(s.num_steps)
    return np.where(graph_steps(d, s), 0.0, self.hw.eager_launch_s)


def graph_steps(d, s) -> np.ndarray:
    """[S] bool: the step replays a CUDA graph (decode only, at most cuda_graph_max_bs sequences on every rank)."""
    cap = d.cuda_graph_max_bs
    return (cap > 0) & ~s.prefill.any(1) & (s.seqs.max(1) <= cap)


def graph_step(d, s, t: int) -> bool:
    """`graph_steps` of step t alone (the per-step loop)."""
    cap = d.cuda_graph_max_bs
    return cap > 0 and not s.prefill[t].any() and int(s.seqs[t].max()) <= cap


def take(slots: Slots, idx) -> Slots:
    return Slots(*(getattr(slots, f)[idx] for f in ("rows_q", "act_bytes_q", "act_n_q", "fp8_rows_q", "low", "all",
                                                     "low_rows_q")))


def offload_stalls(sim, offload, d, pieces: dict, expert_s, active, prep):
    """([S, Lm, R] phase_costs.offload_stall step by step: the caches' state runs in order, compiled in
    offload_fast.py; the FastOffload with the run's figures, or None without offloading). active:
    [S, Lm, P] the slots with rows in each step."""
    stall = np.zeros(expert_s.shape)
    if offload is None:
        return stall, None
    S, Lm, R = expert_s.shape
    fast = FastOffload(offload.capacity, offload.eviction, offload.depth, R, Lm, prep.phy2log.shape[1])
    hidden = (pieces["attention"].max(1) + pieces["router"].max(1) + expert_s.max(2).mean(1)) * d.offload_prefetch_depth
    hw = sim.hw
    for t in range(S):
        stall[t] = fast.step(active[t], prep.slot_bytes, hw.host_bw, float(hidden[t]), hw.mem_bw / 2)
    return stall, fast


def add_steps(totals, per_rank: dict, expert_s, stall, a2a, dense, other, dense_layers: int) -> None:
    """step_totals.add_step over every step: per_rank [S, R], expert_s / stall [S, Lm, R], a2a [S, Lm]."""
    att, Lm = per_rank["attention"], expert_s.shape[1]
    pre = att + per_rank["router"] + per_rank["permute"]  # [S, R]
    post = per_rank["unpermute"] + per_rank["shared_expert"]
    exp_stall = expert_s + stall
    layer = pre.max(1)[:, None] + a2a.dispatch + exp_stall.max(2) + a2a.combine + post.max(1)[:, None]  # [S, Lm]
    busy = (pre + post).mean(1)[:, None] + exp_stall.mean(2)
    dense_t = (att * dense_layers + dense).max(1) if dense_layers else 0.0
    totals.step_s[:] = layer.sum(1) + dense_t + other.max(1)
    lines = {phase: c.mean(1) * (Lm + dense_layers if phase == "attention" else Lm) for phase, c in per_rank.items()}
    lines.update(dispatch=a2a.dispatch.sum(1), combine=a2a.combine.sum(1), experts=expert_s.mean(2).sum(1),
                 offload_wait=stall.mean(2).sum(1), dense_mlp=dense.mean(1), other=other.max(1),
                 straggler_wait=((layer - busy - a2a.dispatch - a2a.combine).clip(min=0).sum(1)
                                 + (dense_t - (att * dense_layers + dense).mean(1) if dense_layers else 0)))
    for phase, value in lines.items():
        totals.phases[phase][:] = value


def overlapped(totals, per_rank: dict, expert_s, stall, a2a, dense, other, dense_layers: int) -> None:
    """step_totals.overlapped over every step (one micro-batch's pieces)."""
    two = {k: 2 * v for k, v in per_rank.items()}
    both = costs.AllToAll(2 * a2a.dispatch, 2 * a2a.combine, 2 * a2a.bytes, 2 * a2a.inter_node_bytes)
    add_steps(totals, two, 2 * expert_s, 2 * stall, both, dense, other, dense_layers)
    pre = (per_rank["attention"] + per_rank["router"] + per_rank["permute"]).max(1)  # [S]
    post = (per_rank["unpermute"] + per_rank["shared_expert"]).max(1)
    exp = (expert_s + stall).max(2)  # [S, Lm]
    pre_l, post_l = np.broadcast_to(pre[:, None], exp.shape), np.broadcast_to(post[:, None], exp.shape)
    hidden = (serial_layer(pre_l, a2a.dispatch, exp, a2a.combine, post_l)
              - tbo_layer(pre_l, a2a.dispatch, exp, a2a.combine, post_l)).sum(1)
    totals.step_s -= hidden
    totals.phases["overlap_hidden"][:] = hidden


def draft_lines(sim, ctx, whole, win: Windows, kinds, launch, m) -> np.ndarray:
    """[S] the drafter's seconds per step (speculative.draft_seconds on the next decode rows' last MoE layer)."""
    out = np.zeros(len(kinds))
    after = win.dec_start[:, 0] + win.decode.sum(1)  # [S] the decode cursor after each step
    last = win.dec.prefix[:, (m.Lm - 1) * m.E:]  # [2N + 1, E] the last MoE layer's prefix counts
    for t in range(len(out)):
        sim.price_as(str(kinds[t]), float(launch[t]))
        row = whole.take(t)
        n = int(row.spec_seqs.max())
        peek = win.dec.window(last, np.array(after[t]), np.array(n)) if n else np.zeros(m.E)
        out[t] = spec_costs.draft_seconds(sim, ctx.spec, row, peek, ctx.draft, m)
    return out


def scale(totals, mask: np.ndarray, factor: float, keep: tuple[str, ...]) -> None:
    """Totals.scale_step on the steps in mask."""
    kept = sum((totals.phases[p][mask] for p in keep), np.zeros(int(mask.sum())))
    totals.step_s[mask] = (totals.step_s[mask] - kept) * factor + kept
    for name, v in totals.phases.items():
        if name not in keep:
            v[mask] *= factor


def tp_lines(self, d, own, ctx, st, kinds, totals) -> None:
    """Each step's TP collectives (tp.tp_collectives on its largest rank), on the critical path."""
    m = self.src.model
    T, sampled = st.T.max(1), st.sampled.max(1)
    for kind in ("prefill", "decode"):
        lat, gather_lat, bw = (self.tp_measured(d, own, kind)
                               or (ctx.tp_lat, None, self.hw.intra_bw * self.hw.link_eff))
        for t in np.nonzero(kinds == kind)[0]:
            totals.add_tp(t, tp_costs.tp_collectives(m, d, float(T[t]), float(sampled[t]), bw, lat, self.b,
                                                     gather_lat))
