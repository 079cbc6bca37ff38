"""Profiling overhead: the same workload end to end with probes off and on (interleaved runs).

Probes off: each phase costs one `is None` test and a shared nullcontext; its cost per step is
measured directly (timeit) and compared with the step time. A profile times the phases of the
unfused layers, so where the engine normally runs decode steps through the fused CPU layer kernels
(model/fused_decode.py), a third, interleaved run measures that normal path: the probes' own cost
is on vs off with both unfused, and the fused path's gain is reported beside it. The runs take
turns, their order reversed every round.

Whole runs differ by tens of percent on a drifting machine (a 2-vCPU VM: 44 % between runs), more
than the probes cost. So a further pass switches the probes on and off every BLOCK steps within one
generation (blocks off, on, on, off, ...) and compares each pair of adjacent blocks step kind by
step kind (`StepBlocks`): the drift of a few steps is small, and the profiler's batched bookkeeping
(`Profiler._flush`, every FLUSH_STEPS probed steps) falls inside the probed blocks' time.
"""

from __future__ import annotations

import statistics
import time
import timeit
from dataclasses import dataclass


BLOCK = 8  # steps per block of the in-run comparison
_SIDES = (False, True, True, False)  # probes on? for blocks 0, 1, 2, 3, 4, ...: a pair is blocks 2j, 2j+1


@dataclass(frozen=True)
class StepBlocks:
    """Every step of the in-run comparison: its kind, wall seconds and whether the probes were on."""
    kinds: list[str]
    seconds: list[float]
    on: list[bool]

    def pairs(self, kind: str) -> list[tuple[float, float]]:
        """(off, on) mean step seconds of `kind` in each pair of adjacent blocks holding both sides."""
        out = []
        for first in range(0, len(self.kinds), 2 * BLOCK):
            side = {False: [], True: []}
            for i in range(first, min(first + 2 * BLOCK, len(self.kinds))):
                if self.kinds[i] == kind:
                    side[self.on[i]].append(self.seconds[i])
            if side[False] and side[True]:
                out.append((statistics.mean(side[False]), statistics.mean(side[True])))
        return out

    def overhead(self, kind: str) -> float | None:
        """Σ on ÷ Σ off over the pairs - 1 (every probed step counts, the flushes' too)."""
        got = self.pairs(kind)
        return sum(on for _, on in got) / sum(off for off, _ in got) - 1.0 if got else None

    def overhead_median(self, kind: str) -> float | None:
        """Median over the pairs of on ÷ off - 1 (robust to a disturbed block; misses most flushes)."""
        got = self.pairs(kind)
        return statistics.median(on / off for off, on in got) - 1.0 if got else None

    def kinds_seen(self) -> list[str]:
        return [k for k in ("decode", "prefill", "mixed") if self.pairs(k)]


@dataclass(frozen=True)
class OverheadResult:
    runs: int
    steps: int
    off_s: list[float]  # wall time of the whole workload per run, probes off
    on_s: list[float]  # same, profiler attached (phase clocks + routing recorder + layer clocks)
    null_scope_ns: float  # cost of one `with phase_scope(None, ...)`
    scopes_per_step: int
    fused_s: list[float] | None = None  # same, probes off, decode steps fused (None: the model has no fused path)
    blocks: StepBlocks | None = None  # probes switched every BLOCK steps within passes of the workload

    @property
    def off_median(self) -> float:
        return statistics.median(self.off_s)

    @property
    def on_median(self) -> float:
        return statistics.median(self.on_s)

    @property
    def overhead(self) -> float:
        return self.on_median / self.off_median - 1.0

    @property
    def overhead_paired(self) -> float:
        """Median over rounds of on ÷ off within the round (the two runs were adjacent, so the
        machine's drift over the rounds cancels)."""
        return statistics.median(a / b for a, b in zip(self.on_s, self.off_s)) - 1.0

    @property
    def overhead_min(self) -> float:
        """On vs off comparing the fastest runs (least disturbed by other load on the machine)."""
        return min(self.on_s) / min(self.off_s) - 1.0

    @property
    def fused_median(self) -> float | None:
        return statistics.median(self.fused_s) if self.fused_s else None

    @property
    def unfused_cost(self) -> float | None:
        """How much longer the unfused path (which a profile times) takes than the fused one."""
        return self.off_median / self.fused_median - 1.0 if self.fused_s else None

    @property
    def off_spread(self) -> float:
        return (max(self.off_s) - min(self.off_s)) / self.off_median

    @property
    def null_share(self) -> float:
        """Fraction of an average probes-off step spent in the null scopes."""
        return self.null_scope_ns * 1e-9 * self.scopes_per_step / (self.off_median / self.steps)


def measure_overhead(settings, runs: int = 7, block_passes: int = 3) -> OverheadResult:
    from moetune.engine.build import build_generator
    from moetune.engine.limits import max_len_of
    from moetune.model.loader import read_spec
    from moetune.model.registry import resolve_model
    from moetune.profile.probe import Profiler
    from moetune.config import parse_config
    from moetune.profile.runner import engine_for
    from moetune.profile.session import greedy_params
    from moetune.profile.workload import batches, load_prompt_texts, prompts_path, request_tokens

    w = settings.workload
    w.check()
    texts = load_prompt_texts(prompts_path(w))
    generator = build_generator(parse_config({**settings.config.model_dump(), "engine": engine_for(
        settings.config, w, texts, max_len_of(settings.config.engine,
                                              read_spec(resolve_model(settings.config.model.path)).max_position))}))
    # ^ the engine `moetune profile` runs: static batches, no prefix cache
    groups = batches(request_tokens(texts, generator.encode, w), w.batch_size)
    params = greedy_params(w.output_len)

    def workload() -> float:
        start = time.perf_counter()
        for group in groups:
            generator.generate(group, params)
        return time.perf_counter() - start

    model = generator.model
    profiler, fused = Profiler(model), model.fused

    def probes_off() -> None:
        model.fused = None
        off.append(workload())
        model.fused = fused

    def probes_on() -> None:
        profiler.attach(generator.engine)
        on.append(workload())
        profiler.detach(generator.engine)
        profiler.records = type(profiler.records)()

    def fused_path() -> None:
        fused_s.append(workload())

    workload()  # warm-up, probes off
    off, on, fused_s = [], [], []
    order = [probes_off, probes_on] + ([fused_path] if fused is not None else [])
    for r in range(runs):  # the order turns each round, so that a machine that drifts favours no side
        for run in order if r % 2 == 0 else order[::-1]:
            run()
    model.fused = None  # (a profile's layers are unfused: both sides of the block pass)
    try:
        blocks = _step_blocks(generator.engine, profiler, groups, params, block_passes)
    finally:
        model.fused = fused
    spec = generator.model.spec
    scopes = spec.num_layers + len(spec.moe_layers) * 7 + (spec.num_layers - len(spec.moe_layers))
    scopes += len(spec.moe_layers) if spec.moe.shared_intermediate_size else 0
    return OverheadResult(runs, w.measured_steps(), off, on, _null_scope_ns(), scopes, fused_s or None, blocks)


def _step_blocks(engine, profiler, groups: list[list[list[int]]], params, passes: int) -> StepBlocks:
    """The workload `passes` times, stepped here: probes attached for the blocks _SIDES marks on."""
    kinds, seconds, on = [], [], []
    attached = False
    for _ in range(passes):
        for group in groups:
            for prompt in group:
                engine.add_request(prompt, params)
            while engine.has_unfinished():
                want = _SIDES[(len(kinds) // BLOCK) % len(_SIDES)]
                if want != attached:
                    (profiler.attach if want else profiler.detach)(engine)
                    attached = want
                before = dict(engine.stats.steps)
                start = time.perf_counter()
                engine.step()
                seconds.append(time.perf_counter() - start)
                kinds.append(next((k for k, n in engine.stats.steps.items() if n != before.get(k)), "none"))
                on.append(attached)
    if attached:
        profiler.detach(engine)
    profiler.records = type(profiler.records)()
    return StepBlocks(kinds, seconds, on)


def _null_scope_ns(n: int = 200_000) -> float:
    from moetune.probe import phase_scope

    def body():
        with phase_scope(None, 0, "router"):
            pass

    return min(timeit.repeat(body, number=n, repeat=3)) / n * 1e9
