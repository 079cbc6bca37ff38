"""What every search or simulation starts from: the trace source, the hardware, the workload, the
base recipe and the simulator over them (user mistakes raised here, before any trial)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moetune.config import RunConfig, load_recipe, parse_config
from moetune.errors import MoetuneError
from moetune.search.cost.hardware import Hardware, get_hardware
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.source import TraceSource, load_source


@dataclass(frozen=True)
class Inputs:
    trace: str  # run directory
    hardware: str = "this-machine"
    nodes: int | None = None
    recipe: str | None = None
    scale_model: str | None = None
    num_requests: int | None = None
    input_len: int | None = None
    output_len: int | None = None


@dataclass
class Setup:
    source: TraceSource
    hardware: Hardware
    workload: SimWorkload
    base: RunConfig
    sim: Simulator


def prepare(inp: Inputs) -> Setup:
    for name, value in (("--num-requests", inp.num_requests), ("--input-len", inp.input_len),
                        ("--output-len", inp.output_len), ("--nodes", inp.nodes)):
        if value is not None and value < 1:
            raise MoetuneError(f"{name} must be at least 1")
    base = load_recipe(inp.recipe) if inp.recipe else None
    source = load_source(Path(inp.trace), inp.scale_model)
    hw = get_hardware(inp.hardware, inp.nodes)
    if base is None:
        base = parse_config({"model": {"path": source.model_path}}, source=f"run directory {inp.trace}")
    w = source.workload
    n = inp.num_requests or w.num_requests
    lens = (inp.input_len,) * n if inp.input_len else tuple((w.prompt_lens * (n // len(w.prompt_lens) + 1))[:n])
    w = SimWorkload(lens, inp.output_len or w.output_len)
    source = source.with_workload(w)
    return Setup(source, hw, w, base, Simulator(source, hw, base.engine.chunked_prefill, multipliers(source, hw)))


def multipliers(source: TraceSource, hw: Hardware) -> dict[str, float]:
    """Call-overhead multipliers fitted on the run when it was recorded here (calibrate.py); else none."""
    if hw.name != "this-machine" or source.scaled_from is not None or source.recorded_on != "cpu":
        return {}
    from moetune.search.cost.calibrate import fit_multipliers
    from moetune.search.cost.phase_costs import CALLS

    return fit_multipliers(source.tables, source.model, hw, CALLS)
