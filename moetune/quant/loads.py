"""Profiled expert loads for the hot-fraction policy: `expert_load.parquet` of a run directory
(profile/SCHEMA.md: step, kind, layer, expert, tokens), summed over every measured step.

Read here rather than through `moetune.profile` because the recipe's quant section is applied when
the engine builds a model, and the engine sits below the profiler (docs/architecture.md §3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moetune.quant.names import QuantError

TABLE = "expert_load.parquet"


def read_expert_loads(run_dir: str | Path, layers: list[int], num_experts: int) -> np.ndarray:
    """[Lm, E] token copies per (MoE layer, logical expert), rows in `layers` order."""
    import pandas as pd

    path = Path(run_dir) / TABLE
    if not Path(run_dir).is_dir():
        raise QuantError(f"expert loads: run directory '{run_dir}' does not exist; run moetune profile --out DIR first")
    try:
        df = pd.read_parquet(path, columns=["layer", "expert", "tokens"])
    except Exception as exc:  # missing file, not Parquet, missing columns: all one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise QuantError(f"expert loads: cannot read {path} ({first}); re-run moetune profile") from None
    loads = np.zeros((len(layers), num_experts))
    row = {layer: j for j, layer in enumerate(layers)}
    sums = df.groupby(["layer", "expert"])["tokens"].sum()
    for (layer, expert), tokens in sums.items():
        if int(layer) not in row or not 0 <= int(expert) < num_experts:
            raise QuantError(f"expert loads in {path} name layer {layer} expert {expert}, which this model "
                             f"(MoE layers {layers}, {num_experts} experts) does not have; profile this model")
        loads[row[int(layer)], int(expert)] = tokens
    return loads
