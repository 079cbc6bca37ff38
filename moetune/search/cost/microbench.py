"""Microbenchmarks of this machine at the shapes a trace implies, timed when a search or
simulation runs (not when the trace was recorded): what `--hardware this-machine` is calibrated on.

The shapes: the trace's model (its real GEMM/GEMV, attention, router, permute/gather and expert
kernels, under the recipe's kernel backend) on synthetic batches of B sequences of the workload's
median prompt length P, for a few decode batch buckets B (powers of 4 up to the workload's
requests, and the trace's batch), each one prefill step of T = B·P tokens and `decodes` decode
steps at B. The routing of these steps is the model's own; only their times are used.

Each bucket is run three times per repeat, buckets and the three runs interleaved, after one
untimed warm-up pass of every bucket (kernel compilation, first-call allocations):

  probed    the phase-timing Profiler attached: seconds per (step, layer, phase), as a profile
            records them (the unfused path: each phase timed)
  plain     no probe: seconds per engine step, the path a one-rank deployment runs (on the CPU the
            fused decode layer, model/fused_decode.py)
  unfused   `UnfusedProbe`: every layer unfused but nothing timed, the path of R > 1 ranks

Everything runs on one rank (the simulator prices EP's all-to-all with the gloo latency measured
by `collective_latency`). The plan bounds it: at most `repeats`, and no repeat beyond `min_repeats`
once `budget_s` is spent since the warm-up began, so a calibration of the bundled model takes a few
seconds on a quiet machine (the model's load and `min_repeats` passes on a busy one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moetune.config import RunConfig
from moetune.search.cost.schedule import SimWorkload

BUCKETS = (1, 4, 16, 64)  # decode batch sizes measured (those up to the workload's requests)
MAX_PROMPT = 256  # longer prompts are measured at this length (the cost model scales T)


@dataclass(frozen=True)
class BenchPlan:
    prompt_len: int  # P
    batches: tuple[int, ...]  # B buckets
    decodes: int = 3  # decode steps per run
    repeats: int = 5  # at most
    budget_s: float = 4.0  # from the warm-up on: no further repeat once this is spent ...
    min_repeats: int = 3  # ... and at least this many are done (a median, a spread)

    def as_dict(self) -> dict:
        return {"prompt_len": self.prompt_len, "batches": list(self.batches), "decodes": self.decodes,
                "repeats": self.repeats}

    @property
    def max_steps(self) -> int:
        """Steps run at most: (warm-up + repeats) × buckets × 3 paths × (1 + decodes) steps."""
        return 3 * (1 + self.repeats) * len(self.batches) * (1 + self.decodes)


def plan_for(w: SimWorkload, batch_size: int) -> BenchPlan:
    lens = sorted(w.prompt_lens)
    P = max(1, min(lens[len(lens) // 2], MAX_PROMPT))
    top = min(w.num_requests, BUCKETS[-1])
    batches = sorted({b for b in BUCKETS if b <= top} | {min(batch_size, top), top})
    return BenchPlan(P, tuple(batches))


@dataclass
class BenchRun:
    """What one repeat measured. Every repeat runs the same steps in the same order (same buckets,
    greedy tokens, deterministic routing), so repeats line up step by step."""

    tables: object  # StepTables of the probed runs (what calibrate.fit_multipliers reads)
    plain: list[tuple[str, float]]  # (kind, seconds) of each plain step, in order
    unfused: list[tuple[str, float]]  # the same under UnfusedProbe (every layer unfused, no clocks)


@dataclass
class StepTables:
    """The four tables of a run dir the call-overhead fit reads (profile/SCHEMA.md), from Records."""

    steps: pd.DataFrame
    phases: pd.DataFrame
    moe: pd.DataFrame
    expert_load: pd.DataFrame


def run_bench(cfg: RunConfig, plan: BenchPlan) -> list[BenchRun]:
    """Build the model once (one rank, the recipe's backend and dtype), warm every bucket, then time."""
    from moetune.engine.build import build_generator
    from moetune.profile.probe import Profiler

    gen = build_generator(_bench_config(cfg, plan))
    prompts = _prompts(cfg, plan)
    start = time.perf_counter()
    for B in plan.batches:  # warm-up, untimed: compilation and first-call allocations on every path
        _plain(gen, prompts[:B], plan.decodes)
        _probed(gen, Profiler(gen.model), prompts[:B], plan.decodes)
        _unfused(gen, prompts[:B], plan.decodes)
    runs: list[BenchRun] = []
    for _ in range(plan.repeats):
        profiler = Profiler(gen.model)
        plain: list[tuple[str, float]] = []
        unfused: list[tuple[str, float]] = []
        for B in plan.batches:  # the three paths interleaved, bucket by bucket
            plain += _plain(gen, prompts[:B], plan.decodes)
            _probed(gen, profiler, prompts[:B], plan.decodes)
            unfused += _unfused(gen, prompts[:B], plan.decodes)
        runs.append(BenchRun(_tables(profiler), plain, unfused))
        if len(runs) >= plan.min_repeats and time.perf_counter() - start > plan.budget_s:
            break
    return runs


def _bench_config(cfg: RunConfig, plan: BenchPlan) -> RunConfig:
    """The recipe's model on one rank, no quant / offload / capacity (the cost model prices those),
    engine sized so that each run is one prefill of all B prompts and then decodes."""
    from moetune.config import parse_config

    data = cfg.model_dump()
    B = max(plan.batches)
    per_seq = -(-(plan.prompt_len + plan.decodes + 2) // data["engine"]["block_size"])
    data["engine"].update(max_num_seqs=B, prefix_caching=False, num_kv_blocks=B * per_seq + 4,
                          max_num_batched_tokens=max(data["engine"]["max_num_batched_tokens"], B * plan.prompt_len))
    data["parallel"] = {}
    data["quant"] = data["offload"] = None
    return parse_config(data, source="calibration microbenchmarks")


def _prompts(cfg: RunConfig, plan: BenchPlan) -> list[list[int]]:
    """The bundled held-out prompts, tokenized, each cut or padded (repeating its tokens) to P."""
    from moetune.engine.tokenizer import load_tokenizer
    from moetune.model.registry import resolve_model
    from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

    texts = load_prompt_texts(prompts_path(Workload()))
    tok = load_tokenizer(resolve_model(cfg.model.path))
    out = []
    for i in range(max(plan.batches)):
        ids = tok.encode(texts[i % len(texts)]) or [0]
        out.append((ids * (plan.prompt_len // len(ids) + 1))[: plan.prompt_len])
    return out


def _params(decodes: int):
    from moetune.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=decodes + 1, temperature=0.0, ignore_eos=True)


def _plain(gen, prompts: list[list[int]], decodes: int) -> list[tuple[str, float]]:
    """(kind, seconds) of each engine step, no probe; the first step is the prefill of every prompt."""
    engine = gen.engine
    for ids in prompts:
        engine.add_request(list(ids), _params(decodes))
    out = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        out.append(("decode" if out else "prefill", time.perf_counter() - start))
    return out


class UnfusedProbe:
    """Times nothing, hears nothing, but says it times phases: the model then runs every layer
    unfused, phase by phase (model/transformer.py), as a deployment on R > 1 ranks does (the fused
    decode layer needs local dispatch), without the profiler's clocks."""

    times_phases = True

    def phase(self, layer: int, name: str):
        from contextlib import nullcontext

        return nullcontext()

    def routed(self, layer: int, route, permute, block_m: int) -> None:
        pass

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        pass


def _unfused(gen, prompts: list[list[int]], decodes: int) -> list[tuple[str, float]]:
    gen.model.attach_probe(UnfusedProbe())
    try:
        return _plain(gen, prompts, decodes)
    finally:
        gen.model.attach_probe(None)


def _probed(gen, profiler, prompts: list[list[int]], decodes: int) -> None:
    profiler.attach(gen.engine)
    try:
        gen.generate(prompts, _params(decodes))
    finally:
        profiler.detach(gen.engine)


def _tables(profiler) -> StepTables:
    from moetune.profile.tables import expert_load_table

    rec = profiler.records
    return StepTables(
        steps=pd.DataFrame(rec.steps, columns=["step", "kind", "batch", "tokens", "context_tokens", "attn_pairs",
                                               "dispatch_bytes", "combine_bytes", "seconds"]),
        phases=pd.DataFrame(rec.phases, columns=["step", "kind", "layer", "phase", "seconds"]),
        moe=pd.DataFrame(rec.moe, columns=["step", "kind", "layer", "tokens", "rows", "padded_rows"]),
        expert_load=expert_load_table(rec.counts, rec.kinds, list(profiler.moe_layers)))


def median_run(runs: list[BenchRun]) -> BenchRun:
    """Step by step, the median over repeats of every timed figure (a phase of one layer in one step;
    a plain step): a preemption by another process spoils one repeat's figure, not the median."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0].tables

    def med(frame_of, keys: list[str]) -> pd.DataFrame:
        both = pd.concat([frame_of(r.tables) for r in runs])
        seconds = both.groupby(keys, sort=False).seconds.median()
        out = frame_of(first).drop(columns="seconds").merge(seconds.reset_index(), on=keys, how="left")
        return out

    steps = med(lambda t: t.steps, ["step"])
    phases = med(lambda t: t.phases, ["step", "layer", "phase"])
    def steps_of(name: str) -> list[tuple[str, float]]:
        ref = getattr(runs[0], name)
        return [(ref[i][0], float(np.median([getattr(r, name)[i][1] for r in runs]))) for i in range(len(ref))]

    return BenchRun(StepTables(steps, phases, first.moe, first.expert_load), steps_of("plain"), steps_of("unfused"))
