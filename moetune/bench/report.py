"""Bench rows → a rich table with the moetune / transformers ratio."""

from __future__ import annotations

from rich.table import Table

from moetune.bench.throughput import BenchRow


def bench_table(rows: list[BenchRow], title: str) -> Table:
    table = Table(title=f"tokens/s (median of runs; min–max) · {title}")
    for col in ("workload", "moetune tok/s", "transformers tok/s", "ratio"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    by_key = {(r.engine, r.workload): r for r in rows}
    for workload in dict.fromkeys(r.workload for r in rows):
        ours, ref = by_key.get(("moetune", workload)), by_key.get(("transformers", workload))
        table.add_row(workload, _cell(ours), _cell(ref),
                      f"{ours.tokens_per_s / ref.tokens_per_s:.2f}×" if ours and ref else "–")
    return table


def _cell(row: BenchRow | None) -> str:
    if row is None:
        return "–"
    lo, hi = row.tokens / row.timing.max_s, row.tokens / row.timing.min_s
    return f"{row.tokens_per_s:,.1f} ({lo:,.0f}–{hi:,.0f})"
