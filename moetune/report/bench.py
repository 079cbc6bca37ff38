"""Bench rows → a table (report/table.py; printed by report/terminal.py) with the moetune /
transformers ratio and moetune's achieved rate set against the machine's limits measured in the same
run."""

from __future__ import annotations

from moetune.bench.roofline import FORMULAS, Limits
from moetune.bench.throughput import BenchRow
from moetune.report.table import Table


def bench_table(rows: list[BenchRow], title: str, limits: Limits | None = None) -> Table:
    cols = ["workload", "moetune tok/s", "transformers tok/s", "ratio"] + (
        ["moetune rate", "of limit", "MB/token"] if limits else [])
    out = []
    by_key = {(r.engine, r.workload): r for r in rows}
    for workload in dict.fromkeys(r.workload for r in rows):
        ours, ref = by_key.get(("moetune", workload)), by_key.get(("transformers", workload))
        cells = [workload, _cell(ours), _cell(ref), f"{ours.tokens_per_s / ref.tokens_per_s:.2f}×" if ours and ref else "–"]
        if limits:
            cells += _rate(ours, limits) + [_mb(ours.bytes_per_token) if ours and ours.weight_bytes else "–"]
        out.append(cells)
    return Table(f"tokens/s (median of runs; min–max) · {title}", cols, out,
                 align_right=[c != "workload" for c in cols])


def limits_lines(limits: Limits) -> list[str]:
    """The machine's limits (measured in this run) and the formula behind every rate, one per line."""
    r, m = limits.read_timing, limits.matmul_timing
    read = f"{limits.read_gbs:,.1f} GB/s ({limits.read_gbs * r.median_s / r.max_s:,.1f}–" \
           f"{limits.read_gbs * r.median_s / r.min_s:,.1f})"
    mm = f"{limits.matmul_gflops:,.1f} GFLOP/s ({limits.matmul_gflops * m.median_s / m.max_s:,.0f}–" \
         f"{limits.matmul_gflops * m.median_s / m.min_s:,.0f})"
    return ["machine limits, measured in this run (median of 5; min–max):",
            f"  read limit    {read:<28} {FORMULAS['read limit']}",
            f"  matmul limit  {mm:<28} {FORMULAS['matmul limit']}",
            "rates (moetune rate column; of limit = rate / the limit sampled once right before each of that",
            "workload's runs, median, in brackets: the machine's speed drifts; without samples, the limit above):",
            f"  decode        {FORMULAS['decode']}",
            "  MB/token      decode: the weight bytes above / tokens generated (each step reads them once for its B rows)",
            f"  prefill       {FORMULAS['prefill']}"]


def _rate(row: BenchRow | None, limits: Limits) -> list[str]:
    if row is None:
        return ["–", "–"]
    if row.weight_bytes:
        return [f"{row.gbytes_per_s:,.1f} GB/s", _of(row.gbytes_per_s, row.limit, limits.read_gbs)]
    if row.flops:
        return [f"{row.gflops_per_s:,.1f} GFLOP/s", _of(row.gflops_per_s, row.limit, limits.matmul_gflops)]
    return ["–", "–"]


def _mb(nbytes: float) -> str:
    mb = nbytes / 1e6
    return f"{mb:,.1f}" if mb >= 10 else f"{mb:.3g}"


def _of(rate: float, beside: float, upfront: float) -> str:
    return f"{rate / beside:.0%} [{beside:,.1f}]" if beside else f"{rate / upfront:.0%}"


def _cell(row: BenchRow | None) -> str:
    if row is None:
        return "–"
    lo, hi = row.tokens / row.timing.max_s, row.tokens / row.timing.min_s
    return f"{row.tokens_per_s:,.1f} ({lo:,.0f}–{hi:,.0f})"
