"""Report tables of a run on R ranks (summary `kinds.*.ranks`); none for a one-process run."""

from __future__ import annotations

from moetune.profile.trace import KINDS
from moetune.report.table import Table, mb, num


def _ranked_kinds(summary: dict) -> list[str]:
    return [k for k in KINDS if k in summary["kinds"] and "ranks" in summary["kinds"][k]]


def measured_rank_table(summary: dict) -> Table:
    rows = []
    for kind in _ranked_kinds(summary):
        for r in summary["kinds"][kind]["ranks"]["per_rank"]:
            a2a = r["dispatch_s"] + r["combine_s"]
            rows.append([kind, f"rank {r['rank']}", f"{r['tokens']} ({r['idle_steps']} idle steps)", str(r["copies_in"]),
                         f"{1e3 * r['moe_s']:.1f}", f"{1e3 * a2a:.1f} ({100 * r['dispatch_combine_share_of_moe']:.0f}%)",
                         f"{1e3 * r['wait_s']:.1f}", mb(r["dispatch_bytes"] + r["combine_bytes"]),
                         f"{mb(r['intra_node_bytes'])} / {mb(r['inter_node_bytes'])}", str(r["waited_for"])])
    p = summary["parallel"]
    return Table(f"Measured per rank (R={p['ep_size']} ranks run, {p['placement']} placement)",
                 ["kind", "rank", "tokens", "copies computed", "MoE ms", "dispatch+combine ms (of MoE)",
                  "waiting ms", "sent", "intra / inter-node", "waited for"], rows,
                 "Each rank's own clocks and dispatcher. Waiting = the split-size exchange before each MoE layer's "
                 "all-to-all (waiting for the slowest rank). `waited for` = lock-step × layer pairs in which this "
                 "rank arrived last.")


def waited_for_table(summary: dict) -> Table:
    rows = []
    for kind in _ranked_kinds(summary):
        ranks = summary["kinds"][kind]["ranks"]
        for r in ranks["per_layer"]:
            waited = " · ".join(f"r{k}: {v}" for k, v in r["waited_for"].items())
            wait = " · ".join(f"r{k}: {v:.2f}" for k, v in r["wait_ms_per_step"].items())
            rows.append([kind, str(r["layer"]), waited, wait, num(r["balancedness_measured"], ".3f"),
                         num(r["balancedness_computed"], ".3f"), num(r["balancedness_without_replicas"], ".3f")])
        mean = ranks["mean_over_layers"]
        rows.append([kind, "mean of layers", "", "", num(mean["balancedness_measured"], ".3f"),
                     num(mean["balancedness_computed"], ".3f"), num(mean["balancedness_without_replicas"], ".3f")])
    return Table("Which rank everyone waited for, per layer", ["kind", "layer", "waited for (times)",
                                                                "wait ms per lock-step", "bal. measured",
                                                                "bal. what-if", "bal. without replicas"], rows,
                 "bal. = mean/max token copies over ranks. measured: copies each rank computed under the run's "
                 "placement; what-if: computed from the routing for the same placement; without replicas: "
                 "computed for contiguous experts, one slot each (– when R does not divide E).")


def rank_tables(summary: dict) -> list[Table]:
    """[] for a one-process run; else the measured per-rank table and the per-layer wait table."""
    if not _ranked_kinds(summary):
        return []
    return [measured_rank_table(summary), waited_for_table(summary)]
