"""What every search or simulation starts from: the trace source, the hardware, the workload, the
base recipe and the simulator over them (user mistakes raised here, before any trial)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moetune.config import RunConfig, load_recipe, parse_config
from moetune.errors import MoetuneError
from moetune.search.cost.calibrate import Calibration
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
    calibrate_on: str = "microbenchmarks"  # this-machine: "microbenchmarks" (taken now, cached) | "trace"
    recalibrate: bool = False  # measure the microbenchmarks again even when cached


@dataclass
class Setup:
    source: TraceSource
    hardware: Hardware
    workload: SimWorkload
    base: RunConfig
    sim: Simulator
    calibration: Calibration | None = None  # this-machine: what it was calibrated on (None: a description)

    def calibrated_on(self) -> str:
        """What the estimates are calibrated on: the calibration's label, or the hardware description's source."""
        if self.calibration is not None:
            return self.calibration.label()
        return f"priced on {self.hardware.name}: {self.hardware.source}"


def prepare(inp: Inputs) -> Setup:
    for name, value in (("--num-requests", inp.num_requests), ("--input-len", inp.input_len),
                        ("--output-len", inp.output_len), ("--nodes", inp.nodes)):
        if value is not None and value < 1:
            raise MoetuneError(f"{name} must be at least 1")
    if inp.calibrate_on not in ("microbenchmarks", "trace"):
        raise MoetuneError(f"--calibrate-on {inp.calibrate_on!r} is not one of microbenchmarks, trace")
    base = load_recipe(inp.recipe) if inp.recipe else None
    source = load_source(Path(inp.trace), inp.scale_model)
    if base is None:
        base = parse_config({"model": {"path": source.model_path}}, source=f"run directory {inp.trace}")
    w = source.workload
    n = inp.num_requests or w.num_requests
    lens = (inp.input_len,) * n if inp.input_len else tuple((w.prompt_lens * (n // len(w.prompt_lens) + 1))[:n])
    w = SimWorkload(lens, inp.output_len or w.output_len)
    source = source.with_workload(w)
    hw, cal = hardware_for(inp, source, base)
    sim = Simulator(source, hw, base.engine.chunked_prefill, cal.multipliers() if cal else None, cal)
    return Setup(source, hw, w, base, sim, cal)


def hardware_for(inp: Inputs, source: TraceSource, base: RunConfig) -> tuple[Hardware, Calibration | None]:
    """The hardware priced on and, for this-machine, its calibration (calibrate.py): microbenchmarks of
    the trace's model taken now (cached per machine), or the trace's own phase times when asked and
    recorded here. A scaled model (--scale-model) cannot run here: this-machine's figures, uncalibrated."""
    if inp.hardware != "this-machine" or source.scaled_from is not None:
        return get_hardware(inp.hardware, inp.nodes), None
    from moetune.search.cost.calibrate import microbench_calibration, trace_calibration

    if inp.calibrate_on == "trace":
        hw = get_hardware(inp.hardware, inp.nodes)
        if source.recorded_on != "cpu":
            raise MoetuneError(f"--calibrate-on trace: the trace was recorded on {source.recorded_on}, not this "
                               "machine's CPU")
        return hw, trace_calibration(source, hw, source.machine_state)
    hw, cal = microbench_calibration(source, base, inp.recalibrate)
    return (hw.with_nodes(inp.nodes) if inp.nodes else hw), cal
