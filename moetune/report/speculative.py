"""Speculative decoding by batch size (summary.json `speculative.by_batch`, profile/specsweep.py):
a figure of the decode speed-up (speculative ÷ plain, median and min–max of the rounds) and of the
distinct experts a step wakes per MoE layer (a verify step against the same step as a plain
decode) against the batch size, and the table shown beside it."""

from __future__ import annotations

import statistics

from moetune.report.figure import figure, png
from moetune.report.table import Table, mb

STEM = "speculative"
CAPTION = "Speculative decoding by batch size: decode speed-up over plain, and experts per step (verify vs plain)"


def by_batch(summary: dict) -> list[dict]:
    """The run's per-batch rows, [] without them (no speculation, a run on ranks, an older run dir)."""
    return summary.get("speculative", {}).get("by_batch") or []


def speculation_plot(rows: list[dict], method: str, num_experts: int) -> bytes:
    """Left: speed-up vs batch (log2 axis), 1.0 marked; right: distinct experts per MoE layer and step,
    out of the layer's `num_experts`."""
    batches = [r["batch"] for r in rows]
    plt, fig = figure(11, 3.6)
    ax = fig.add_subplot(1, 2, 1)
    med = [r["speedup"] for r in rows]
    err = [[m - r["speedup_min"] for m, r in zip(med, rows)], [r["speedup_max"] - m for m, r in zip(med, rows)]]
    ax.errorbar(batches, med, yerr=err, marker="o", color="#4c72b0", capsize=4, label=method)
    ax.axhline(1.0, color="#8c8c8c", linestyle="--", linewidth=1, label="plain decoding")
    for b, m, r in zip(batches, med, rows):
        ax.annotate(f"{m:.2f}× · {100 * r['acceptance_rate']:.0f}%", (b, m), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("decode tok/s ÷ plain")
    ax.set_title("speed-up (median, min–max) · acceptance")
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 2, 2)
    ax.plot(batches, [r["experts_per_layer_verify"] for r in rows], marker="o", color="#c44e52", label="verify step")
    ax.plot(batches, [r["experts_per_layer_plain"] for r in rows], marker="s", color="#55a868",
            label="plain decode (same batch)")
    ax.axhline(num_experts, color="#8c8c8c", linestyle=":", linewidth=1, label=f"all {num_experts} experts")
    ax.set_ylim(0, num_experts * 1.08)
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("distinct experts per MoE layer")
    ax.set_title("experts woken per step")
    ax.legend(fontsize=8)
    for a in fig.axes:
        if len(batches) > 1:
            a.set_xscale("log", base=2)
        a.set_xticks(batches, [str(b) for b in batches])
    return png(plt, fig)


def speculation_table(summary: dict) -> Table:
    s = summary["speculative"]
    rows = [[str(r["batch"]), _tok_s(r["plain_tok_s"]), _tok_s(r["speculative_tok_s"]),
             f"{r['speedup']:.2f}× ({r['speedup_min']:.2f}–{r['speedup_max']:.2f})",
             f"{100 * r['acceptance_rate']:.0f}%", f"{r['tokens_per_verify']:.2f}",
             f"{r['experts_per_layer_verify']:.1f} vs {r['experts_per_layer_plain']:.1f}",
             f"{mb(r['expert_bytes_per_step_verify'])} vs {mb(r['expert_bytes_per_step_plain'])}"]
            for r in by_batch(summary)]
    rounds = by_batch(summary)[0]["rounds"]
    note = (f"{s['method']} against plain decoding on the same engine and requests, {rounds} interleaved rounds "
            "each, timed from after the prefill (the profiler detached); tok/s median (min–max); experts: distinct "
            "per MoE layer and step, a verify step's decode rows against its last tokens alone (a plain decode of "
            "the same batch); bytes per step include the drafter's own expert reads.")
    return Table("Speculative decoding by batch size", ["batch", "plain tok/s", "speculative tok/s", "speed-up",
                                                        "acceptance", "tokens/verify", "experts/layer verify vs plain",
                                                        "expert bytes/step verify vs plain"], rows, note)


def _tok_s(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}–{max(xs):.1f})"
