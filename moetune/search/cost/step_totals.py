"""What a simulated run's steps add up to: seconds per step and per phase line (`Totals`), and how
one step's per-rank pieces become its time — serially (`add_step`) or under two-batch overlap
(`overlapped`, from one micro-batch's pieces: `StepRows.half`)."""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from moetune.search.cost import phase_costs as costs
from moetune.search.cost import tp as tp_costs
from moetune.search.cost.offload import OffloadState
from moetune.search.cost.overlap import serial_layer, tbo_layer

PHASES = ("attention", "router", "permute", "dispatch", "experts", "offload_wait", "combine", "unpermute",
          "shared_expert", "dense_mlp", "other", "straggler_wait")
CAPACITY_PRICED = ("drop", "buffer")  # capacity policies the trace prices (reroute needs the routers' scores)


@dataclass
class Totals:
    """What the steps add up to: seconds per step and per phase line, and the run's detail counters."""

    step_s: np.ndarray  # [S]
    phases: dict  # PHASES → [S]
    rank_rows: np.ndarray  # [Lm, R] expert rows computed per rank, over the run
    a2a_bytes: float = 0.0
    inter_bytes: float = 0.0
    low_copies: float = 0.0
    all_copies: float = 0.0
    capacity: str = "none"  # the capacity policy priced (CAPACITY_PRICED), else none
    routed: float = 0.0  # copies the trace routed (under a capacity)
    over: float = 0.0  # of which beyond capacity: dropped (drop) or in the second pass (buffer)

    @classmethod
    def empty(cls, S: int, Lm: int, R: int, tp: bool = False, capacity: str = "none",
              spec: bool = False, overlap: bool = False) -> "Totals":
        capacity = capacity if capacity in CAPACITY_PRICED else "none"
        names = (PHASES + (tp_costs.TP_PHASES if tp else ())  # the TP lines only where TP runs
                 + (("overflow",) if capacity == "buffer" else ())  # the second pass only under buffer
                 + (("draft",) if spec else ())  # the drafter only under speculation
                 + (("overlap_hidden",) if overlap else ()))  # two-batch overlap: seconds hidden (step = Σ − it)
        return cls(np.zeros(S), {k: np.zeros(S) for k in names}, np.zeros((Lm, R)), capacity=capacity)

    def add_capacity(self, split: costs.CapacitySplit, counts: np.ndarray) -> None:
        self.routed += float(counts.sum())
        self.over += float(split.over.sum())

    def add_line(self, t: int, phase: str, seconds: float) -> None:
        """One more piece on step t's critical path, its own phase line."""
        self.phases[phase][t] = seconds
        self.step_s[t] += seconds

    def add_tp(self, t: int, seconds: dict[str, float]) -> None:
        """Step t's tensor-parallel collectives: each its own phase line, all on the step's critical path."""
        for phase, value in seconds.items():
            self.phases[phase][t] = value
            self.step_s[t] += value

    def scale_step(self, t: int, factor: float, keep: tuple[str, ...] = ()) -> None:
        """Step t and each of its phase lines × factor (this-machine's calibrated path factor), but the
        lines in `keep` (priced from their own measurement: the EP exchange)."""
        kept = sum(self.phases[p][t] for p in keep)
        self.step_s[t] = (self.step_s[t] - kept) * factor + kept
        for name, v in self.phases.items():
            if name not in keep:
                v[t] *= factor

    def add_slots(self, slots: costs.SlotRows, prep) -> None:  # prep: simulate.Prepared
        self.rank_rows += slots.rows_q
        self.low_copies += float((slots.slot_rows * prep.low_share_slot).sum())
        self.all_copies += float(slots.slot_rows.sum())

    def detail(self, R: int, offload: OffloadState | None) -> dict:
        rl = self.rank_rows
        out = {
            "rank_imbalance": float(np.mean(rl.max(1) / np.maximum(rl.mean(1), 1e-12))) if R > 1 else 1.0,
            "a2a_bytes": self.a2a_bytes, "inter_node_bytes": self.inter_bytes,
            "low_precision_share": self.low_copies / self.all_copies if self.all_copies else 0.0,
            "offload_stall_s": float(self.phases["offload_wait"].sum()),
        }
        if offload is not None:
            out.update(cache_hit_rate=1 - offload.misses / max(offload.needs, 1),
                       fetched_bytes=offload.fetched_bytes, wasted_prefetch_bytes=offload.wasted_bytes)
        if self.capacity != "none":
            share = self.over / self.routed if self.routed else 0.0
            out.update(dropped_fraction=share if self.capacity == "drop" else 0.0,
                       buffered_fraction=share if self.capacity == "buffer" else 0.0)
        return out


def add_step(totals: Totals, t: int, per_rank: dict, expert_s: np.ndarray, stall: np.ndarray, a2a,
              dense: np.ndarray, other: np.ndarray, dense_layers: int, overflow: np.ndarray | None = None) -> None:
    """Step t's time and phase lines from its pieces ([R] per rank, [Lm, R] per layer and rank):
    layer = max_r(attention + router + permute) + dispatch + max_q(experts + stall) + combine
    [+ overflow: buffer's second pass, [Lm]] + max_r(unpermute + shared); the straggler wait is what
    the slowest rank adds to the mean one (the second pass's own wait is inside its line)."""
    att, Lm = per_rank["attention"], expert_s.shape[0]
    pre = att + per_rank["router"] + per_rank["permute"]  # [R]
    post = per_rank["unpermute"] + per_rank["shared_expert"]
    exp_stall = expert_s + stall  # [Lm, R]
    layer = pre.max() + a2a.dispatch + exp_stall.max(1) + a2a.combine + post.max()  # [Lm]
    if overflow is not None:
        layer = layer + overflow
        totals.phases["overflow"][t] = float(overflow.sum())
    busy = (pre + post).mean() + exp_stall.mean(1)  # [Lm]
    dense_t = (att * dense_layers + dense).max() if dense_layers else 0.0
    totals.step_s[t] = float(layer.sum() + dense_t + other.max())
    lines = {phase: float(c.mean() * (Lm + dense_layers if phase == "attention" else Lm)) for phase, c in per_rank.items()}
    lines.update(dispatch=float(a2a.dispatch.sum()), combine=float(a2a.combine.sum()),
                 experts=float(expert_s.mean(1).sum()), offload_wait=float(stall.mean(1).sum()),
                 dense_mlp=float(dense.mean()), other=float(other.max()),
                 straggler_wait=float((layer - busy - a2a.dispatch - a2a.combine
                                       - (0 if overflow is None else overflow)).clip(min=0).sum()
                                      + (dense_t - (att * dense_layers + dense).mean() if dense_layers else 0)))
    for phase, value in lines.items():
        totals.phases[phase][t] = value


def overlapped(totals: Totals, t: int, per_rank: dict, expert_s: np.ndarray, stall: np.ndarray, a2a,
                dense: np.ndarray, other: np.ndarray, dense_layers: int, overflow: np.ndarray | None) -> None:
    """Step t under two-batch overlap from one micro-batch's pieces (overlap.py): the phase lines are
    both halves' (twice one's), the step is the overlapped schedule; `overlap_hidden` is what it hides."""
    two = {k: 2 * v for k, v in per_rank.items()}
    both = costs.AllToAll(2 * a2a.dispatch, 2 * a2a.combine, 2 * a2a.bytes, 2 * a2a.inter_node_bytes)
    add_step(totals, t, two, 2 * expert_s, 2 * stall, both, dense, other, dense_layers,
              None if overflow is None else 2 * overflow)
    pre = (per_rank["attention"] + per_rank["router"] + per_rank["permute"]).max()
    post = (per_rank["unpermute"] + per_rank["shared_expert"]).max()
    exp = (expert_s + stall).max(1) + (0 if overflow is None else overflow)  # [Lm]
    pre_l, post_l = np.full_like(exp, pre), np.full_like(exp, post)
    hidden = float((serial_layer(pre_l, a2a.dispatch, exp, a2a.combine, post_l)
                    - tbo_layer(pre_l, a2a.dispatch, exp, a2a.combine, post_l)).sum())
    totals.step_s[t] -= hidden
    totals.phases["overlap_hidden"][t] = hidden
