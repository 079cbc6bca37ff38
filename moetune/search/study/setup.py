"""What every search or simulation starts from: the trace source, the hardware, the workload, the
base recipe and the simulator over them (user mistakes raised here, before any trial)."""

from __future__ import annotations

import functools

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.config import RunConfig, load_recipe, parse_config
from moetune.errors import MoetuneError
from moetune.search.cost.hardware import Hardware, get_hardware
from moetune.search.cost.op_tables import ENGINES, choose
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.slo_load import DEFAULT_CONCURRENCY
from moetune.search.cost.source import TraceSource, load_source
from moetune.search.study.space import Limits

if TYPE_CHECKING:
    from moetune.search.cost.calibrate import Calibration  # imports pandas: loaded where it calibrates


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
    concurrency: int | None = None  # closed loop: in flight per deployment replica (schedule.py)
    request_rate: float | None = None  # Poisson arrivals: requests/s per deployment replica
    warmup_requests: int | None = None  # excluded at each end of a steady-state run (default below)
    arrival_seed: int = 0
    slo_ttft_ms: float | None = None  # goodput's per-request limits
    slo_tpot_ms: float | None = None
    slo_percentile: float = 90.0  # the SLOs apply at this percentile of the steady window's requests
    burst: bool = False  # every request at t = 0 (the default on this-machine; on GPU hardware only when asked)
    unstaggered: bool = False  # a closed loop's first wave joins at t = 0 (synchronized waves; schedule.py)
    spec_acceptance: float | None = None  # speculation's per-token acceptance where the trace did not measure it
    scale_routing: str | None = None  # --scale-routing stats | blocks | loads:FILE (None: stats; scale.py)
    engine: str | None = None  # --engine: whose measured op tables price the GPU ops (cost/op_tables.py; None: vllm)
    engine_version: str | None = None  # --engine-version (None: the tables' current version)


@dataclass
class Setup:
    source: TraceSource
    hardware: Hardware
    workload: SimWorkload
    base: RunConfig
    sim: Simulator
    calibration: Calibration | None = None  # this-machine: what it was calibrated on (None: a description)
    not_priced: tuple[str, ...] = ()  # simulate --recipe: keys priced as something else (cost.simulate.priced_instead)
    engine_correction: str = ""  # --calibrate-on engine: the correction's label (engine_calibration.py)

    def calibrated_on(self) -> str:
        """What the estimates are calibrated on: the calibration's label, or the hardware description's source."""
        base = self.calibration.label() if self.calibration is not None else \
            f"priced on {self.hardware.name}: {self.hardware.source}"
        return f"{base}; {self.engine_correction}" if self.engine_correction else base

    def limits(self) -> Limits:
        """What the pruning rules need (the most requests in flight: each replica's in a steady state)."""
        m = self.source.model
        from moetune.search.cost.speculative import mtp_layers

        mtp = mtp_layers(self.source.model_path) if self.source.scaled_from is None else 0
        w = self.workload
        return Limits(m.E, m.K, self.hardware.max_ranks, w.most_in_flight, w.mode != "burst", model=m,
                      mtp_layers=mtp, max_model_len=max(w.prompt_lens) + w.output_len,
                      chunked_prefill=self.base.engine.chunked_prefill)


def prepare(inp: Inputs) -> Setup:
    for name, value in (("--num-requests", inp.num_requests), ("--input-len", inp.input_len),
                        ("--output-len", inp.output_len), ("--nodes", inp.nodes)):
        if value is not None and value < 1:
            raise MoetuneError(f"{name} must be at least 1")
    if inp.calibrate_on not in ("microbenchmarks", "trace", "engine"):
        raise MoetuneError(f"--calibrate-on {inp.calibrate_on!r} is not one of microbenchmarks, trace, engine")
    if inp.engine is not None and inp.engine not in ENGINES:
        raise MoetuneError(f"--engine {inp.engine!r} is not one of {', '.join(ENGINES)}")
    base = load_recipe(inp.recipe) if inp.recipe else None
    source = load_source(Path(inp.trace), inp.scale_model, inp.scale_routing)
    if base is None:
        base = parse_config({"model": {"path": source.model_path}}, source=f"run directory {inp.trace}")
    w = workload(inp, source.workload)
    source = source.with_workload(w)
    hw, cal = hardware_for(inp, source, base)
    sim = Simulator(source, hw, base.engine.chunked_prefill, cal.multipliers() if cal else None, cal)
    sim.spec_acceptance = inp.spec_acceptance
    sim.tables = choose(hw.name, inp.engine or "vllm", inp.engine_version) if hw.name != "this-machine" else None
    if cal is not None and cal.source == "microbenchmarks":  # a recipe path of its own is timed on its own
        from moetune.search.cost.calibrate import priced_config
        sim.base_config = priced_config(source, base)
        sim.config_of = functools.partial(_recipe_of, sim.base_config, str(inp.trace))
    return Setup(source, hw, w, base, sim, cal)


def _recipe_of(base: RunConfig, trace: str, d) -> RunConfig:
    from moetune.search.study.space import to_config

    return to_config(base, d, loads=trace)


def workload(inp: Inputs, run: SimWorkload) -> SimWorkload:
    """The run's workload with the command line's changes. A steady-state mode defaults to enough
    requests for a steady window (4·C in a closed loop, 100 at a rate) and excludes C (closed loop)
    or a fifth of them (rate) at each end. Which mode (`load_mode`): --burst, --concurrency and
    --request-rate as asked; else on GPU hardware the steady state the SLOs allow (the concurrency
    found per deployment, slo_load.py) when an SLO is given, DEFAULT_CONCURRENCY when none is; else
    (this-machine, where `measure` runs bursts) a burst."""
    mode = load_mode(inp)
    if mode == "find":
        return _find_load_template(inp, run)
    concurrency = inp.concurrency or (DEFAULT_CONCURRENCY if mode == "concurrency" else 0)
    steady_n = {"burst": 0, "concurrency": 4 * concurrency, "rate": 100}[mode]
    n = inp.num_requests or max(run.num_requests, steady_n)
    warmup = inp.warmup_requests if inp.warmup_requests is not None else \
        {"burst": 0, "concurrency": concurrency, "rate": n // 5}[mode]
    return SimWorkload(_lens(inp, run, n), inp.output_len or run.output_len, mode, concurrency,
                       inp.request_rate or 0.0, inp.arrival_seed, warmup, inp.slo_ttft_ms, inp.slo_tpot_ms,
                       inp.slo_percentile, stagger=not inp.unstaggered)


def load_mode(inp: Inputs) -> str:
    """burst | concurrency | rate | find (the highest concurrency meeting the SLOs), user mistakes raised."""
    for name, value in (("--concurrency", inp.concurrency), ("--request-rate", inp.request_rate),
                        ("--slo-ttft-ms", inp.slo_ttft_ms), ("--slo-tpot-ms", inp.slo_tpot_ms)):
        if value is not None and value <= 0:
            raise MoetuneError(f"{name} must be above 0")
    if not 0 < inp.slo_percentile < 100:
        raise MoetuneError("--slo-percentile must be above 0 and below 100")
    if inp.concurrency is not None and inp.request_rate is not None:
        raise MoetuneError("--concurrency and --request-rate are two workloads: give one")
    if inp.burst and (inp.concurrency is not None or inp.request_rate is not None):
        raise MoetuneError("--burst sends every request at t=0: drop --concurrency / --request-rate")
    if inp.warmup_requests is not None and inp.warmup_requests < 0:
        raise MoetuneError("--warmup-requests must be at least 0")
    if inp.unstaggered and (inp.burst or inp.request_rate is not None or (
            inp.hardware == "this-machine" and inp.concurrency is None)):
        raise MoetuneError("--unstaggered sets how a closed loop starts: give it with --concurrency or, on GPU "
                           "hardware, the SLOs (not with --burst or --request-rate)")
    if inp.concurrency:
        return "concurrency"
    if inp.request_rate:
        return "rate"
    if inp.burst or inp.hardware == "this-machine":
        return "burst"
    return "find" if inp.slo_ttft_ms is not None or inp.slo_tpot_ms is not None else "concurrency"


def _lens(inp: Inputs, run: SimWorkload, n: int) -> tuple[int, ...]:
    return (inp.input_len,) * n if inp.input_len else tuple((run.prompt_lens * (n // len(run.prompt_lens) + 1))[:n])


UNBOUNDED_LOAD = 1024 * 16  # requests per replica when --num-requests does not bound the load: 1024 seqs × 16 ranks


def _find_load_template(inp: Inputs, run: SimWorkload) -> SimWorkload:
    """The workload each deployment's load search starts from (slo_load.at_concurrency makes each probe's):
    the prompts and output length, the SLOs, and as many requests as may be in flight per replica:
    --num-requests (a bound on the load searched), else enough that every rank's max_num_seqs is held
    (the memory rule prices the KV cache of the sequences a rank holds; `most_in_flight`: that bound)."""
    n = inp.num_requests or UNBOUNDED_LOAD
    return SimWorkload(_lens(inp, run, n), inp.output_len or run.output_len, "concurrency", 0, 0.0, inp.arrival_seed,
                       0, inp.slo_ttft_ms, inp.slo_tpot_ms, inp.slo_percentile, find_load=True,
                       stagger=not inp.unstaggered)


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
