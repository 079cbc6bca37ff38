"""Report tables of a run on a tensor-parallel mesh (summary `parallel.mesh` / `parallel.tp`); none otherwise."""

from __future__ import annotations

from moetune.report.table import Table


def tp_tables(summary: dict) -> list[Table]:
    """[] unless the run had tensor-parallel groups; else the mesh and the per-rank collective table."""
    par = summary.get("parallel", {})
    tp, mesh = par.get("tp"), par.get("mesh")
    if not tp or not mesh:
        return []
    coords = mesh["rank_coords"]
    rows = []
    for cell in tp["per_rank_collective"]:
        d, t = coords[str(cell["rank"])] if str(cell["rank"]) in coords else coords[cell["rank"]]
        forward = tp["forward_s"].get(str(cell["rank"]), tp["forward_s"].get(cell["rank"], 0.0))
        rows.append([f"rank {cell['rank']} (DP {d}, TP {t})", cell["phase"], str(cell["calls"]),
                     f"{1e3 * cell['seconds']:.2f}", f"{100 * cell['share_of_forward']:.1f}%",
                     f"{cell['bytes'] / 2**20:.3f} MiB", f"{1e3 * forward:.1f}"])
    title = (f"Tensor-parallel collectives per rank (mesh: {mesh['ep_size']} DP/EP groups × {mesh['tp_group']} "
             f"TP ranks; tp_size {mesh['tp_size']}, expert_tp_size {mesh['expert_tp_size']})")
    note = ("Each rank's own clocks. tp_allreduce: the sum of the partial outputs after attention, dense MLPs "
            "and split MoE layers; tp_embed: the vocab-parallel embedding's all-reduce; tp_gather: the LM head's "
            f"all-gather before sampling. Bytes are payload ({tp['bytes_rule']}); share = of the rank's forward seconds.")
    return [Table(title, ["rank", "collective", "calls", "ms", "share", "payload", "forward ms"], rows, note)]
