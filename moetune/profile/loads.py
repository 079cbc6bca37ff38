"""Expert loads of a profile run, the input of a load-aware placement (`moetune placement RUN_DIR`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class RunLoads:
    loads: np.ndarray  # [Lm, E] token copies per logical expert over every measured step
    layers: list[int]  # model layer of each row
    model_type: str | None
    num_layers: int | None  # L (every decoder layer), for SGLang's map
    num_groups: int  # the router's expert groups (1 without group-limited routing)


def run_loads(path: Path) -> RunLoads:
    """Loads replayed from the run's routing trace (logical experts, replicas never split them)."""
    from moetune.profile.rundir import read_run

    run = read_run(Path(path))
    trace = run.trace
    E = trace.num_experts
    ids = trace.topk_ids.astype(np.int64)  # [N, Lm, K]
    loads = np.stack([np.bincount(ids[:, j].ravel(), minlength=E) for j in range(ids.shape[1])]).astype(np.float64)
    model = run.summary.get("model", {})
    return RunLoads(loads, [int(x) for x in trace.layers], model.get("model_type"), model.get("num_layers"),
                    _groups(run.recipe_yaml))


def _groups(recipe_yaml: str) -> int:
    """n_group of the run's model, when its checkpoint is still there; else 1."""
    import yaml

    from moetune.errors import MoetuneError
    from moetune.model.loader import read_spec
    from moetune.model.registry import resolve_model

    try:
        path = (yaml.safe_load(recipe_yaml) or {}).get("model", {}).get("path")
        return read_spec(resolve_model(path)).moe.router.n_group
    except (MoetuneError, AttributeError, yaml.YAMLError):
        return 1
