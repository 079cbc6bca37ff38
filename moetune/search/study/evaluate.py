"""The two evaluators behind one surface: `check(d)` (a reason not to time it, or None) and
`evaluate(d) -> Metrics`. `simulate` prices a deployment from the trace; `measure` runs it here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from moetune.config import RunConfig
from moetune.search.study.measure import measure, placement_file_for
from moetune.search.cost.metrics import Metrics
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simulate import Simulator, unpriced_reason
from moetune.search.study.deploy_knobs import deploy_reason
from moetune.search.study.engine_formats import format_reason
from moetune.search.study.repair import MemoryRule
from moetune.search.study.space import RECIPE_VALUES, Deployment, recipe_accepts, to_config, default_knobs


class Evaluator(Protocol):
    name: str

    def check(self, d: Deployment) -> str | None: ...

    def memory_rule(self) -> MemoryRule | None: ...  # the estimate a point is repaired to fit by, or None

    def evaluate(self, d: Deployment) -> Metrics: ...


@dataclass
class SimulateEvaluator:
    sim: Simulator
    workload: SimWorkload
    name: str = "simulate"

    def check(self, d: Deployment) -> str | None:
        return (unpriced_reason(d) or format_reason(self.sim, d) or deploy_reason(self.sim, d, self.workload)
                or self.sim.spec_reason(d) or self.sim.memory_reason(d))

    def memory_rule(self) -> MemoryRule:
        return MemoryRule(lambda d: self.sim.memory(d).total, self.sim.memory_reason)

    def evaluate(self, d: Deployment) -> Metrics:
        return self.sim.evaluate(d, self.workload)


@dataclass
class MeasureEvaluator:
    """Runs each deployment on this machine; `sim` (hardware this-machine) supplies the memory rule."""

    base: RunConfig
    sim: Simulator
    workload: SimWorkload
    prompts: tuple
    work_dir: Path
    name: str = "measure"
    _files: dict = field(default_factory=dict)

    def check(self, d: Deployment) -> str | None:
        values = d.as_dict()
        neutral = Deployment().as_dict()
        for knob in default_knobs(1, 1):
            said = values[knob.name] in RECIPE_VALUES.get(knob.name, ())  # e.g. dense_format int8: quant.dense
            priced_only = not recipe_accepts(knob.key) or knob.key.startswith("deploy.")  # the GPU engines' knobs
            if priced_only and values[knob.name] != neutral[knob.name] and not said:
                why = "a serving-engine knob moetune's engine does not run" if recipe_accepts(knob.key) else \
                    "a what-if knob (no recipe key on this branch)"
                return f"{knob.key} is {why}: simulate only"
        return self.sim.memory_reason(d)

    def memory_rule(self) -> None:
        return None  # measured: a point that does not fit is pruned, as sampled

    def config(self, d: Deployment) -> RunConfig:
        placement = None
        if d.placement == "eplb":
            key = (d.ep_size, d.redundant_experts)
            if key not in self._files:
                self._files[key] = placement_file_for(self.base, self.sim.src.loads, self.work_dir,
                                                      d.redundant_experts, d.ep_size)
            placement = self._files[key]
        return to_config(self.base, d, placement, loads=str(self.sim.src.run_dir))

    def evaluate(self, d: Deployment) -> Metrics:
        act = self.sim.memory(d).activations
        return measure(self.config(d), self.prompts, self.workload, act_bytes_estimate=act)
