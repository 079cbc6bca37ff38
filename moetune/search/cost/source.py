"""What a run directory gives the simulator: the routing trace (split into the prompt tokens' and
the decode tokens' rows, optionally scaled to another architecture), per-layer expert loads, the
model it was recorded on and the workload it ran.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simmodel import SimModel, sim_model


@dataclass
class TraceSource:
    run_dir: Path
    model: SimModel  # the model priced (the scaled one with --scale-model)
    prefill_ids: np.ndarray  # [Np, Lm, K] rows of prompt tokens (prefill and mixed steps)
    decode_ids: np.ndarray  # [Nd, Lm, K] rows of decode tokens
    loads: np.ndarray  # [Lm, E] token copies per expert over the whole trace
    workload: SimWorkload  # the run's own workload (all requests at once)
    batch_size: int  # the profile's batch (what `moetune profile` ran at once)
    recorded_on: str  # device of the run
    model_path: str | None  # the recipe's model.path of the run
    scaled_from: str | None = None
    tables: object = None  # the run's RunTables (phase times: calibrate.py)
    prompts: str | None = None  # the prompts file the run used (the measure evaluator reuses it)
    machine_state: dict | None = None  # env.json `machine`: the machine the timings were taken on
    speculative: dict | None = None  # summary.json `speculative`: the profile's acceptance (cost/speculative.py)
    scale_routing: str | None = None  # how the routing was scaled (scale.py ScaleRouting.label), None: not scaled

    def with_workload(self, w: SimWorkload) -> "TraceSource":
        return replace(self, workload=w)


def load_source(run_dir: str | Path, scale_config: str | None = None, scale_routing: str | None = None) -> TraceSource:
    """The run directory's trace source; with scale_config, its routing scaled to that model by
    scale_routing (`--scale-routing`: stats (default) | blocks | loads:FILE, search/cost/scale.py)."""
    import yaml

    from moetune.model.registry import resolve_model
    from moetune.model.validate import read_spec
    from moetune.profile.rundir import read_run
    from moetune.errors import MoetuneError
    from moetune.search.cost.scale import parse_scale_routing, read_scale_spec, scale_routing_ids, stored_format

    run = read_run(Path(run_dir))
    recipe = yaml.safe_load(run.recipe_yaml) or {}
    model_path = (recipe.get("model") or {}).get("path")
    trace = run.trace
    kinds = np.repeat(trace.step_kind, np.diff(trace.step_offsets))  # [N] kind of each row
    ids = trace.topk_ids
    if scale_routing is not None and not scale_config:
        raise MoetuneError("--scale-routing needs --scale-model (the routing it scales)")
    routing = parse_scale_routing(scale_routing)
    if scale_config:
        spec = read_scale_spec(scale_config)
        ids = scale_routing_ids(ids, trace.num_experts, spec, routing)
        model, scaled = sim_model(spec, Path(scale_config).stem), run.summary["model"].get("name")
        model = replace(model, weight_format=stored_format(scale_config))  # an fp8 checkpoint: priced as stored
    else:
        spec = read_spec(resolve_model(model_path))
        model, scaled = sim_model(spec, run.summary["model"].get("name", spec.model_type)), None
    w = run.summary["workload"]
    prompt_lens = _prompt_lens(run, w)
    flat = ids.astype(np.int64)
    loads = np.stack([np.bincount(flat[:, j].reshape(-1), minlength=model.E) for j in range(flat.shape[1])])
    return TraceSource(Path(run_dir), model, ids[kinds != 1], ids[kinds == 1], loads.astype(np.float64),
                       SimWorkload(prompt_lens, int(w["output_len"])), int(w["batch_size"]),
                       str(run.env.get("device", {}).get("type", run.summary["model"].get("device", "?"))),
                       model_path, scaled, run.tables, w.get("prompts"), run.env.get("machine"),
                       run.summary.get("speculative"),
                       routing.label() if scale_config else None)


def _prompt_lens(run, w: dict) -> tuple[int, ...]:
    n = int(w["num_requests"])
    if w.get("input_len"):
        return (int(w["input_len"]),) * n
    steps = run.tables.steps
    pre = steps[steps.kind == "prefill"]
    per = [int(round(t / b)) for t, b in zip(pre.tokens, pre.batch) for _ in range(int(b))]
    return tuple((per * (n // max(len(per), 1) + 1))[:n]) if per else (64,) * n


def workload(prompt_len: int, output_len: int, requests: int) -> SimWorkload:
    return SimWorkload((prompt_len,) * requests, output_len)
