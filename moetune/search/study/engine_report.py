"""Estimate beside measurement in a search's outputs: which trials were measured on an engine (every
trial of `--evaluator engine`, the top K of `--remeasure-on`), their estimated and measured figures
and the error, the estimated-vs-measured plot, the ranking by measured values where they exist, and
the check that a measured winner's emitted launch file is the file that ran.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from moetune.report.tables import Table
from moetune.search.cost.metrics import OBJECTIVES
from moetune.search.study.optuna_study import TrialRow

FIGURES = (("output_tok_s", "output tok/s"), ("ttft_ms", "TTFT ms (P50)"), ("tpot_ms", "TPOT ms (P50)"))


@dataclass(frozen=True)
class Pair:
    number: int
    label: str
    estimate: dict  # COMPARED figures, simulated
    measured: dict | None  # the measured Metrics as a dict; None: the measurement failed
    error: str | None = None


def pairs_of(rows: list[TrialRow], remeasured: list) -> list[Pair]:
    """Every trial measured on an engine (its detail carries the estimate), then the re-measured ones."""
    out = []
    for r in rows:
        detail = (r.metrics or {}).get("detail") or {}
        if r.state == "COMPLETE" and "estimate" in detail and not r.metrics.get("estimated"):
            out.append(Pair(r.number, r.deployment.label(), detail["estimate"], r.metrics))
    for row, m, err in remeasured:
        if m is None or "estimate" in m.detail:  # an engine re-measure carries its estimate
            est = m.detail["estimate"] if m is not None else row.metrics or {}
            out.append(Pair(row.number, row.deployment.label(), est, m.as_dict() if m else None, err))
    return out


def estimate_table(pairs: list[Pair], where: str) -> Table:
    cols = ["trial", "deployment"]
    for _, name in FIGURES:
        cols += [f"{name} (estimated)", f"{name} (measured)", "error"]
    rows = []
    for p in pairs:
        row = [str(p.number), p.label]
        for key, _ in FIGURES:
            est, got = p.estimate.get(key), (p.measured or {}).get(key)
            err = f"{(est - got) / got:+.1%}" if est is not None and got else ""
            row += [_num(est), _num(got) if p.measured else f"failed: {p.error or ''}", err]
        rows.append(row)
    return Table(f"Estimated vs measured on {where}", cols, rows,
                 "error = (estimated − measured) / measured; TTFT and TPOT: the median request")


def _num(x) -> str:
    return "" if x is None else f"{x:,.4g}"


def estimate_png(pairs: list[Pair], where: str) -> bytes | None:
    """One panel per figure: estimated (x) against measured (y) of each measured trial, the y = x line."""
    done = [p for p in pairs if p.measured]
    if not done:
        return None
    from moetune.report.figure import figure, png

    plt, fig = figure(10.5, 3.6)
    for i, (key, name) in enumerate(FIGURES):
        ax = fig.add_subplot(1, len(FIGURES), i + 1)
        xs = [p.estimate.get(key, 0.0) for p in done]
        ys = [p.measured.get(key, 0.0) for p in done]
        ax.scatter(xs, ys, s=24, c="#4c72b0")
        for p, x, y in zip(done, xs, ys):
            ax.annotate(str(p.number), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        top = max(xs + ys) * 1.1 or 1.0
        ax.plot([0, top], [0, top], color="#999999", linewidth=1, linestyle="--")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel(f"{name}, estimated")
        ax.set_ylabel(f"{name}, measured on {where}")
    fig.suptitle("Estimated vs measured per trial (dashed: estimate = measurement)", fontsize=10)
    return png(plt, fig)


def measured_first(best: list[TrialRow], remeasured: list, objectives: tuple[str, ...]) -> list[TrialRow]:
    """The ranking by measured values where they exist: the re-measured trials (their metrics and values
    now the measured ones) best first, then the others in their estimated order."""
    measured = {row.number: m for row, m, err in remeasured if m is not None}
    if not measured:
        return best
    sign = 1 if OBJECTIVES[objectives[0]][1] == "maximize" else -1
    mine = [replace(r, metrics=measured[r.number].as_dict(), values=[measured[r.number].value(o) for o in objectives])
            for r in best if r.number in measured]
    mine.sort(key=lambda r: -sign * r.values[0])
    return mine + [r for r in best if r.number not in measured]


def launch_identity(winner: TrialRow, files: dict) -> Table | None:
    """For a winner measured on an engine: the emitted launch file against the one that ran, byte for byte."""
    detail = (winner.metrics or {}).get("detail") or {}
    ran, engine = detail.get("launch_file"), detail.get("engine")
    if not ran or engine not in files:
        return None
    same = Path(ran).is_file() and Path(ran).read_bytes() == Path(files[engine]).read_bytes()
    return Table("The winner's launch file is the one measured", ["emitted", "ran", "identical"],
                 [[str(files[engine]), ran, "yes" if same else "NO: the emitted file differs from the one measured"]])
