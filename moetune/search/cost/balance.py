"""How much of an estimate is expert-load imbalance, and which routing it was priced on.

The simulator prices a MoE layer as the slowest rank's (step_totals.py `add_step`); its
`straggler_wait` phase line is what the slowest rank adds to the mean rank's busy time. So a
step "with perfect balance" is the step as priced minus that line: every rank at the mean rank's
expert, attention and permute time (the all-to-all's own skew stays in; estimated like the rest).
A pick's gain over the baseline then splits into less straggler wait (imbalance) and the rest.

`routing` names the routing the estimate replayed: the trace's own (`trace`), or with
`--scale-model` how it was scaled (`stats`, `blocks`, `loads:FILE`: search/cost/scale.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.search.cost.metrics import Metrics


@dataclass(frozen=True)
class Balance:
    kind: str  # the step kind the figures are of (decode when there are decode-only steps)
    rank_imbalance: float  # max / mean rows per rank, mean of layers (1.0: one rank or even)
    step_ms: float  # mean step of that kind as priced
    balanced_ms: float  # the same with perfect balance (minus the straggler wait)

    @property
    def imbalance_share(self) -> float:
        """The part of the priced step that is imbalance (0 .. 1)."""
        return 1 - self.balanced_ms / self.step_ms if self.step_ms > 0 else 0.0


def balance_of(m: Metrics) -> Balance | None:
    """The Balance of an estimate with phase lines (None: a measured trial, no phases)."""
    kind = "decode" if "decode" in m.phases_ms else next(iter(m.phases_ms), None)
    if kind is None or "straggler_wait" not in m.phases_ms[kind]:
        return None
    ph = m.phases_ms[kind]
    step = float(ph.get("step", 0.0))
    return Balance(kind, float(m.detail.get("rank_imbalance", 1.0)), step, max(step - ph["straggler_wait"], 0.0))


def routing_of(m: Metrics) -> str:
    return str(m.detail.get("routing", "trace"))


def balance_sentence(m: Metrics) -> str:
    """One line for `moetune simulate` and the report: the routing, the rank imbalance and the step
    as priced vs with perfect balance."""
    b = balance_of(m)
    routing = routing_of(m)
    where = "the trace's own routing" if routing == "trace" else f"the routing scaled by {routing}"
    if b is None:
        return f"Priced on {where}."
    return (f"Priced on {where}: rank imbalance (max/mean rows per rank) {b.rank_imbalance:.2f}; {b.kind} step "
            f"{b.step_ms:.4g} ms as priced, {b.balanced_ms:.4g} ms with perfect balance (imbalance "
            f"{b.imbalance_share:.0%} of it, estimated).")


def gain_sentence(win: Metrics, base: Metrics) -> str | None:
    """How much of the winner's step-time saving over the baseline is less imbalance (None: no phases,
    or no saving)."""
    w, b = balance_of(win), balance_of(base)
    if w is None or b is None or w.kind != b.kind:
        return None
    saved = b.step_ms - w.step_ms
    if saved <= 0:
        return None
    from_balance = (b.step_ms - b.balanced_ms) - (w.step_ms - w.balanced_ms)
    return (f"Of the {saved:.4g} ms the winner saves per {w.kind} step, {from_balance:.4g} ms "
            f"({from_balance / saved:.0%}) is less straggler wait (load imbalance: {w.rank_imbalance:.2f} vs "
            f"{b.rank_imbalance:.2f} max/mean) and {saved - from_balance:.4g} ms the rest; with perfect balance "
            f"both would be {w.balanced_ms:.4g} vs {b.balanced_ms:.4g} ms ({routing_of(win)} routing).")
