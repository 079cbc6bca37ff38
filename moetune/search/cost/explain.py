"""`moetune simulate --explain`: the cost model's terms per step kind and phase, as priced.

Every phase is priced (simulate.py) as

  seconds = (max(compute, memory) + overhead) · share
  compute = FLOPs / (FLOP/s · gemm_eff)      memory = bytes / (bytes/s · mem_eff)
  overhead = calls · op_overhead · k          share = ranks per core on this-machine (else 1)

`note_terms` sums each term as priced (the mean over ranks and layers of one call of the formula;
roof = max(compute, memory) before the mean) per (step kind, phase); `terms_table` shows their means over the steps of each kind, with the
hardware figures and the calibration's path factor beside them.
"""

from __future__ import annotations

import numpy as np

from moetune.report.table import Table

TERMS = ("flops", "bytes", "calls", "k", "compute_s", "memory_s", "roof_s", "overhead_s", "share", "seconds")


def note_terms(terms: dict, key: tuple[str, str], **values) -> None:
    row = terms.setdefault(key, {"n": 0, **{t: 0.0 for t in TERMS}})
    row["n"] += 1
    for name, v in values.items():
        row[name] += float(np.mean(v))


def terms_table(terms: dict, hw, path: dict[str, float]) -> Table:
    """Rows per (kind, phase) in pricing order; `path`: kind → the factor a step is multiplied by."""
    rows = []
    for (kind, phase), row in terms.items():
        n = max(row["n"], 1)
        mean = {t: row[t] / n for t in TERMS}
        rows.append([kind, phase, f"{mean['flops']:.3g}", f"{mean['bytes']:.3g}", f"{mean['calls']:.3g}",
                     f"{mean['k']:.3g}", f"{1e3 * mean['compute_s']:.4f}", f"{1e3 * mean['memory_s']:.4f}",
                     f"{1e3 * mean['overhead_s']:.4f}", f"{mean['share']:.3g}", f"{1e3 * mean['seconds']:.4f}"])
    for kind, f in path.items():
        rows.append([kind, "path (× step)", "", "", "", f"{f:.3g}", "", "", "", "", ""])
    note = (f"per layer and rank, mean over the steps of each kind; ms = (max(compute, memory) + overhead) · share; "
            f"FLOP/s {hw.flops:.3g} (1 thread {hw.flops_one_thread:.3g}) · eff {hw.gemm_eff:g}, memory "
            f"{hw.mem_bw:.3g} B/s · eff {hw.mem_eff:g}, one call {1e6 * hw.op_overhead_s:.2f} µs; "
            "k: the calibrated call-overhead multiplier; × step: the deployment's path (fused at R = 1, unfused "
            "at R > 1, no clocks) over the probed one")
    return Table("Cost model terms (estimated)", ["kind", "phase", "FLOPs", "bytes", "calls", "k", "compute ms",
                                                  "memory ms", "overhead ms", "share", "ms"], rows, note)
