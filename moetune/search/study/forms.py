"""Which serving form wins a search: the best feasible aggregated trial against the best feasible
disaggregated one (cost/disagg.py), on the first objective, in one sentence for the report."""

from __future__ import annotations

from moetune.search.cost.metrics import OBJECTIVES


def form_sentence(rows, objective: str) -> str | None:
    """None where the trials did not try both forms (rows: optuna_study.TrialRow)."""
    key, direction = OBJECTIVES[objective]
    best: dict[bool, tuple[float, str]] = {}
    for r in rows:
        if r.state != "COMPLETE" or not r.feasible or not r.metrics:
            continue
        d = r.deployment
        value = float(r.metrics.get(key, 0.0))
        split = bool(d.prefill_workers)
        if split not in best or (value < best[split][0] if direction == "minimize" else value > best[split][0]):
            best[split] = (value, d.label())
    if len(best) < 2:
        return None
    (agg, agg_label), (dis, dis_label) = best[False], best[True]
    disagg_wins = dis < agg if direction == "minimize" else dis > agg
    win, lose = (dis, agg) if disagg_wins else (agg, dis)
    ratio = f"{win / lose:.2f}×" if lose else "∞×"
    form = "Disaggregated prefill/decode" if disagg_wins else "Aggregated serving"
    return (f"{form} wins on {key}: {win:,.4g} vs {lose:,.4g} ({ratio}; estimated) — best aggregated "
            f"{agg_label}; best disaggregated {dis_label}.")
