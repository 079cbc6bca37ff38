"""The profiling-overhead table (`moetune profile --overhead`), from an OverheadResult."""

from __future__ import annotations

from moetune.profile.overhead import BLOCK, OverheadResult
from moetune.report.tables import Table


def overhead_table(r: OverheadResult) -> Table:
    unfused = " (unfused layers)" if r.fused_s else ""
    rows = [["probes off%s (median of %d)" % (unfused, r.runs), f"{r.off_median:.3f} s", f"{1e3 * r.off_median / r.steps:.2f} ms/step"],
            ["probes on (median of %d)" % r.runs, f"{r.on_median:.3f} s", f"{1e3 * r.on_median / r.steps:.2f} ms/step"],
            ["probes off / on, fastest run", f"{min(r.off_s):.3f} s / {min(r.on_s):.3f} s", ""],
            ["overhead on vs off", f"{100 * r.overhead:+.1f}% (medians)", f"{100 * r.overhead_min:+.1f}% (fastest runs)"],
            ["overhead on vs off, per round", f"{100 * r.overhead_paired:+.1f}% (median of on ÷ off)",
             "each round's two runs are adjacent"],
            *_block_rows(r),
            ["run-to-run spread, probes off", f"{100 * r.off_spread:.1f}%", "(max − min) / median"],
            ["probes off: null scope", f"{r.null_scope_ns:.0f} ns × {r.scopes_per_step}/step",
             f"{100 * r.null_share:.3f}% of a step"]]
    if r.fused_s:
        rows.insert(0, ["probes off, fused decode layers: the normal path (median of %d)" % r.runs,
                        f"{r.fused_median:.3f} s", f"{1e3 * r.fused_median / r.steps:.2f} ms/step"])
        rows.append(["unfused layers (what a profile times) vs fused", f"{100 * r.unfused_cost:+.1f}% (medians)",
                     "model/fused_decode.py"])
    return Table(f"Profiling overhead ({r.steps} steps per run)", ["", "value", ""], rows)


def _block_rows(r: OverheadResult) -> list[list[str]]:
    """The in-run comparison: probes switched every BLOCK steps, per step kind."""
    if r.blocks is None:
        return []
    return [[f"overhead on vs off, {kind} steps, switched every {BLOCK} steps in one run",
             f"{100 * r.blocks.overhead(kind):+.1f}% (Σ on ÷ Σ off, {len(r.blocks.pairs(kind))} block pairs)",
             f"{100 * r.blocks.overhead_median(kind):+.1f}% (median of pairs)"] for kind in r.blocks.kinds_seen()]
