"""`moetune placement`: expert loads (a run dir or a JSON file) → a placement JSON + SGLang's map."""

from __future__ import annotations

from typing import Optional

import typer


def placement(
    run_dir: Optional[str] = typer.Argument(None, help="Run directory of `moetune profile` (its expert loads)."),
    loads: Optional[str] = typer.Option(None, "--loads", help="JSON list of per-layer expert loads (lists of numbers)."),
    ep_size: int = typer.Option(..., "--ep-size", help="Expert-parallel ranks R."),
    redundant_experts: int = typer.Option(0, "--redundant-experts", help="Extra slots N for hot-expert replicas."),
    nodes: int = typer.Option(1, "--nodes", help="Nodes the ranks span (EPLB packs expert groups onto nodes)."),
    groups: Optional[int] = typer.Option(None, "--groups", help="Expert groups (default: the model's n_group, else 1)."),
    policy: str = typer.Option("eplb", "--policy", help="eplb | contiguous | round_robin."),
    out: str = typer.Option(..., "--out", "-o", help="Placement JSON to write; SGLang's map goes to <stem>.sglang.json."),
) -> None:
    """Place E logical experts (+ N replicas) on R ranks; prints per-rank balancedness."""
    from pathlib import Path

    from moetune.errors import MoetuneError
    from moetune.moe.placement import make_placement, read_loads, write_placement

    if (run_dir is None) == (loads is None):
        raise MoetuneError("give either a run directory or --loads FILE (exactly one)")
    if run_dir is not None:
        from moetune.profile.loads import run_loads

        run = run_loads(Path(run_dir))
        table, layers, model_type, num_layers, default_groups = (run.loads, run.layers, run.model_type,
                                                                 run.num_layers, run.num_groups)
    else:
        table = read_loads(Path(loads))
        layers, model_type, num_layers, default_groups = list(range(table.shape[0])), None, None, 1
    placed = make_placement(policy, table.shape[1], ep_size, layers, redundant_experts, table,
                            groups if groups is not None else default_groups, nodes, model_type)
    E = table.shape[1]
    before = make_placement("contiguous", E, ep_size, layers).rank_loads(table) if E % ep_size == 0 else None
    sglang = write_placement(placed, Path(out), table, num_layers)
    line = f"{policy} with {redundant_experts} redundant: {_balancedness(placed.rank_loads(table)):.3f}"
    if before is not None:
        line = f"contiguous without replicas: {_balancedness(before):.3f} → " + line
    print("balancedness (mean / max rank load, mean over layers): " + line)
    print(f"wrote {out} and {sglang}")


def _balancedness(rank_loads) -> float:
    import numpy as np

    peak = rank_loads.max(1)
    return float(np.mean(np.where(peak > 0, rank_loads.mean(1) / np.maximum(peak, 1e-12), 1.0)))
