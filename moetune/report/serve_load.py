"""The `moetune bench-serve` result (a dict, as written to JSON) as a table."""

from __future__ import annotations

from moetune.report.tables import Table


def load_table(result: dict) -> Table:
    s = result["settings"]
    load = (f"rate {s['request_rate']:g} req/s" if s["request_rate"] else "all at once") + (
        f", concurrency {s['concurrency']}" if s["concurrency"] else "")
    failures = ", ".join(f"{k}: {v}" for k, v in sorted(result["failures_by_status"].items())) or "none"
    rows = [
        ["load", f"{result['requests']} requests, {load}, output_len {s['output_len']}"],
        ["answered / refused / lost", f"{result['answered']} / {result['refused']} / {result['lost']}"],
        ["failures by status", failures],
        ["duration", f"{result['duration_s']:.2f} s"],
        ["request throughput", f"{result['request_throughput']:.2f} req/s"],
        ["output token throughput", f"{result['output_token_throughput']:.1f} tok/s"],
        ["total token throughput", f"{result['total_token_throughput']:.1f} tok/s"],
    ]
    for name in ("ttft", "tpot", "itl", "latency"):
        d = result[f"{name}_ms"]
        rows.append([f"{name.upper() if name != 'latency' else 'latency'} ms (mean / P50 / P90 / P99)",
                     " / ".join(_ms(d[k]) for k in ("mean", "p50", "p90", "p99"))])
    return Table(f"bench-serve: {result['model']} at {s['url']}", ["", "value"], rows)


def _ms(value) -> str:
    return "–" if value is None else f"{value:.1f}"
