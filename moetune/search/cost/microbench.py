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


def _bench_config(cfg: RunConfig, plan: BenchPlan, keep_variant: bool = False) -> RunConfig:
    """The recipe's model on one rank, no quant / offload / capacity (keep_variant: the recipe's quant
    and offload sections kept, for run_variant_bench), engine sized so that each run is one prefill
    of all B prompts and then decodes."""
    from moetune.config import parse_config

    data = cfg.model_dump()
    B = max(plan.batches)
    per_seq = -(-(plan.prompt_len + plan.decodes + 2) // data["engine"]["block_size"])
    data["engine"].update(max_num_seqs=B, prefix_caching=False, num_kv_blocks=B * per_seq + 4,
                          max_num_batched_tokens=max(data["engine"]["max_num_batched_tokens"], B * plan.prompt_len),
                          speculative=None)  # plain steps: the simulator prices the verify rows on them
    data["parallel"] = {}
    if not keep_variant:
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


# ---- the recipe's own path: a quant / offload variant at one rank, R expert-parallel ranks ----------


def run_variant_bench(cfg: RunConfig, variant: RunConfig, plan: BenchPlan) -> list[dict[str, float]]:
    """Per repeat and step kind, Σ plain step seconds of `variant` (the recipe's quant / offload
    sections, one rank) over Σ plain step seconds of the base model, the two interleaved bucket by
    bucket after one untimed warm-up of each: what the variant's own path (its expert kernels, the
    offload store's acquire / copy / evict, the unfused layers it forces) costs over the fp32 one."""
    from moetune.engine.build import build_generator

    base = build_generator(_bench_config(cfg, plan))
    other = build_generator(_bench_config(variant, plan, keep_variant=True))
    prompts = _prompts(cfg, plan)
    start = time.perf_counter()
    for B in plan.batches:
        _plain(base, prompts[:B], plan.decodes)
        _plain(other, prompts[:B], plan.decodes)
    out: list[dict[str, float]] = []
    for _ in range(plan.repeats):
        sums = {"base": {}, "variant": {}}
        for B in plan.batches:
            for name, gen in (("base", base), ("variant", other)):
                for kind, sec in _plain(gen, prompts[:B], plan.decodes):
                    sums[name][kind] = sums[name].get(kind, 0.0) + sec
        out.append({k: sums["variant"][k] / s for k, s in sums["base"].items() if s > 0 and k in sums["variant"]})
        if len(out) >= plan.min_repeats and time.perf_counter() - start > plan.budget_s:
            break
    return out


@dataclass(frozen=True)
class EPBenchJob:
    """Picklable: spawned ranks receive it. Every rank runs the same lock-steps: per bucket b, R·b
    requests (b per rank) of P tokens, one prefill lock-step and `decodes` decode ones; rank 0 times
    each lock-step and the dispatcher's all-to-alls in it (the split-size exchange and its wait, the
    two row exchanges: AllToAllDispatcher.wait_s + transfer_s)."""

    prompts: tuple[tuple[int, ...], ...]
    batches: tuple[int, ...]  # b per rank
    decodes: int
    repeats: int
    min_repeats: int
    budget_s: float

    def __call__(self, dp) -> list[dict[str, list[float]]] | None:
        disp = _dispatchers(dp.model)
        start = time.perf_counter()
        for b in self.batches:  # warm-up, untimed
            self._bucket(dp, b, disp)
        runs: list[dict[str, list[float]]] = []
        for _ in range(self.repeats):
            sums: dict[str, list[float]] = {}  # kind → [lock-step s, exchange s, MoE layers exchanged]
            for b in self.batches:
                for kind, sec, exch, calls in self._bucket(dp, b, disp):
                    acc = sums.setdefault(kind, [0.0, 0.0, 0.0])
                    acc[0], acc[1], acc[2] = acc[0] + sec, acc[1] + exch, acc[2] + calls
            runs.append(sums)
            done = len(runs) >= self.min_repeats and time.perf_counter() - start > self.budget_s
            flag = _agree(done)  # every rank stops after the same repeat
            if flag:
                break
        return runs if dp.rank == 0 else None

    def _bucket(self, dp, b: int, disp) -> list[tuple[str, float, float, int]]:
        n = b * dp.world
        for i in dp.mine(n):
            dp.engine.add_request(list(self.prompts[i]), _params(self.decodes))
        out = []
        while True:
            before = [(d.wait_s + d.transfer_s, d.calls) for d in disp]
            t0 = time.perf_counter()
            if dp.step() is None:
                break
            sec = time.perf_counter() - t0
            exch = sum(d.wait_s + d.transfer_s for d in disp) - sum(x for x, _ in before)
            calls = sum(d.calls for d in disp) - sum(c for _, c in before)
            out.append(("decode" if out else "prefill", sec, exch, calls))
        return out


def _dispatchers(model) -> list:
    """The distinct all-to-all dispatchers of the model's MoE layers (one shared by all, in practice)."""
    seen = {}
    for layer in model.layers:
        d = getattr(layer.mlp, "dispatcher", None)
        if d is not None and hasattr(d, "transfer_s"):
            seen[id(d)] = d
    return list(seen.values())


def _agree(flag: bool) -> bool:
    """Whether any rank says stop (an all-reduce of one int)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def run_ep_bench(cfg: RunConfig, plan: BenchPlan, ranks: int) -> list[dict[str, list[float]]]:
    """The engine on `ranks` expert-parallel processes (contiguous placement, one thread each, as
    `measure` runs them) at the plan's buckets per rank: per repeat and step kind, [Σ lock-step s,
    Σ exchange s, MoE layers exchanged]."""
    from moetune.config import parse_config
    from moetune.engine.distributed import run_ranks

    data = _bench_config(cfg, plan).model_dump()
    data["parallel"] = {"ep_size": ranks, "placement": "contiguous", "ranks_per_node": ranks}
    wide = BenchPlan(plan.prompt_len, tuple(b * ranks for b in plan.batches), plan.decodes)
    prompts = tuple(tuple(p) for p in _prompts(cfg, wide))
    job = EPBenchJob(prompts, plan.batches, plan.decodes, plan.repeats, plan.min_repeats, plan.budget_s)
    return run_ranks(parse_config(data, source="calibration microbenchmarks"), job) or []


@dataclass(frozen=True)
class TPBenchJob:
    """Picklable: spawned ranks receive it. The G ranks of one tensor-parallel group run the same
    lock-steps: per bucket b, b requests of P tokens, one prefill lock-step and `decodes` decode ones;
    rank 0 times each lock-step and the group's collectives in it (model.tp: TPComm's seconds, calls
    and payload bytes per phase — tp_allreduce and tp_embed are all-reduces of [T, D], tp_gather the
    LM head's all-gather)."""

    prompts: tuple[tuple[int, ...], ...]
    batches: tuple[int, ...]
    decodes: int
    repeats: int
    min_repeats: int
    budget_s: float

    def __call__(self, dp) -> list[dict[str, dict[str, float]]] | None:
        comm = dp.model.tp
        start = time.perf_counter()
        for b in self.batches:  # warm-up, untimed
            self._bucket(dp, b, comm)
        runs: list[dict[str, dict[str, float]]] = []
        for _ in range(self.repeats):
            sums: dict[str, dict[str, float]] = {}  # kind → Σ of each TPStep field
            for b in self.batches:
                for kind, fields in self._bucket(dp, b, comm):
                    acc = sums.setdefault(kind, dict.fromkeys(fields, 0.0))
                    for name, v in fields.items():
                        acc[name] += v
            runs.append(sums)
            if _agree(len(runs) >= self.min_repeats and time.perf_counter() - start > self.budget_s):
                break
        return runs if dp.rank == 0 else None

    def _bucket(self, dp, b: int, comm) -> list[tuple[str, dict[str, float]]]:
        for i in dp.mine(b * dp.dp_size):
            dp.engine.add_request(list(self.prompts[i]), _params(self.decodes))
        out = []
        while True:
            comm.take()
            before = dict(comm.seconds_by)
            t0 = time.perf_counter()
            if dp.step() is None:
                break
            sec = time.perf_counter() - t0
            took = {p: s - before.get(p, 0.0) for p, s in comm.seconds_by.items()}  # phase → s in this step
            out.append(("decode" if out else "prefill", _tp_fields(sec, took, comm.take())))
        return out


def _tp_fields(step_s: float, took: dict[str, float], counted: dict) -> dict[str, float]:
    """One lock-step's figures: step seconds, seconds inside the collectives (coll_s), per collective kind
    (allreduce: tp_allreduce + tp_embed, gather: tp_gather) its seconds, calls and payload bytes
    (took: phase → seconds; TPComm.take: (layer, phase) → [bytes, calls])."""
    ar = [v for (_, phase), v in counted.items() if phase in ("tp_allreduce", "tp_embed")]
    ga = [v for (_, phase), v in counted.items() if phase == "tp_gather"]
    return {"step_s": step_s, "coll_s": sum(took.values()),
            "allreduce_s": took.get("tp_allreduce", 0.0) + took.get("tp_embed", 0.0),
            "gather_s": took.get("tp_gather", 0.0), "ar_calls": float(sum(c for _, c in ar)),
            "ar_bytes": float(sum(n for n, _ in ar)), "ga_calls": float(sum(c for _, c in ga)),
            "ga_bytes": float(sum(n for n, _ in ga))}


def run_tp_bench(cfg: RunConfig, plan: BenchPlan, tp_size: int, expert_tp_size: int) -> list[dict]:
    """The engine's tensor-parallel group of G = max(tp_size, expert_tp_size) processes (one thread each,
    as `measure` and `moetune profile --tp-size` run them) at the plan's buckets: per repeat and step
    kind, Σ of step_s, coll_s (inside TPComm's collectives), ar_calls / ar_bytes, ga_calls / ga_bytes."""
    from moetune.config import parse_config
    from moetune.engine.distributed import run_ranks

    data = _bench_config(cfg, plan).model_dump()
    G = max(tp_size, expert_tp_size)
    data["parallel"] = {"tp_size": tp_size, "expert_tp_size": expert_tp_size, "ranks_per_node": G}
    prompts = tuple(tuple(p) for p in _prompts(cfg, plan))
    job = TPBenchJob(prompts, plan.batches, plan.decodes, plan.repeats, plan.min_repeats, plan.budget_s)
    return run_ranks(parse_config(data, source="calibration microbenchmarks"), job) or []
