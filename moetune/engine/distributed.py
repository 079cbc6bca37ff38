"""Data-parallel attention with expert parallelism: each rank runs its own Engine over its share of
the requests (request i on rank i mod R), and all ranks step together. With tensor parallelism
(engine/mesh.py) the G ranks of one DP group serve the same requests as one stream, each holding
its slices of the weights: request i goes to DP group i mod ep_size.

One lock-step = an all-reduce of "anything left?" (all ranks stop together), then a forward on
every rank: the engine's step where it has work, an empty forward (`idle_forward`, T = 0)
where it has none, so every rank enters each MoE layer's all-to-all. Request errors are agreed on
before the first step, so one rank's bad request fails every rank the same way.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterator, Protocol, TypeVar

import torch
import torch.distributed as dist

from moetune.config import RunConfig
from moetune.engine.build import build_generator
from moetune.engine.target import resolve_device, resolve_placement, resolve_target, torch_dtype
from moetune.engine.engine import Engine, RequestOutput
from moetune.engine.ep_launch import RankContext, launch
from moetune.engine.generate import Completion, Generator
from moetune.engine.mesh import Mesh, MeshGroups, join_mesh
from moetune.engine.sampling import SamplingParams
from moetune.engine.torchrun import under_torchrun
from moetune.errors import MoetuneError, RequestError
from moetune.model.loader import check_dense, read_spec
from moetune.model.quant_checkpoint import dense_format, read_block
from moetune.model.registry import resolve_model
from moetune.model.tp import TPComm, plan_of
from moetune.model.tp_check import check_tp
from moetune.moe.all_to_all import AllToAllDispatcher

T = TypeVar("T")


class LockStepObserver(Protocol):
    """Told around each lock-step's forward on this rank (the profiler's per-rank view)."""

    def lockstep_begin(self) -> None: ...

    def lockstep_end(self, idle: bool) -> None:
        """idle: this rank ran the empty forward (nothing of its own to compute)."""
        ...


class DPGenerator:
    """One rank's generator in a group of R; every rank calls the same methods with the same arguments."""

    def __init__(self, generator: Generator, ctx: RankContext, groups: MeshGroups | None = None):
        self.generator, self.ctx = generator, ctx
        self.rank, self.world = ctx.rank, ctx.world
        self.groups = groups
        # requests go to DP groups; the G ranks of a group serve the same ones (G = 1 without TP)
        self.dp_rank, self.dp_size = (groups.dp_rank, groups.mesh.ep) if groups else (ctx.rank, ctx.world)
        self.tp_rank = groups.tp_rank if groups else 0
        self.steps = 0  # lock-steps taken (idle ones included)
        self.idle_steps = 0  # of which this rank ran the empty forward
        self.observer: LockStepObserver | None = None

    @property
    def engine(self) -> Engine:
        return self.generator.engine

    @property
    def model(self):
        return self.generator.model

    def mine(self, n: int) -> list[int]:
        """Indices of the n requests this rank serves (its DP group's)."""
        return list(range(self.dp_rank, n, self.dp_size))

    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams]) -> list[Completion] | None:
        """Completions in prompt order on rank 0; None on the other ranks."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        mine = self.mine(len(prompts))
        rids = self._add([self.generator.encode(prompts[i]) for i in mine], [plist[i] for i in mine], mine)
        seqs = [self.engine.sequence(r) for r in rids]
        while self.step() is not None:
            pass
        done = [(i, Completion(s.prompt_ids, s.output_ids, s.text, s.finish_reason or "length"))
                for i, s in zip(mine, seqs) if self.tp_rank == 0]  # one answer per DP group
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, done, group=self.ctx.group)
        if self.rank != 0:
            return None
        return [c for _, c in sorted((pair for part in gathered for pair in part), key=lambda p: p[0])]

    def stream(self, prompt, params: SamplingParams) -> Iterator[str]:
        """The completion of one prompt (served by rank 0), piece by piece on rank 0; nothing elsewhere."""
        rids = self._add([self.generator.encode(prompt)] if self.dp_rank == 0 else [], [params], [0])
        while (outputs := self.step()) is not None:
            for out in outputs:
                if rids and out.request_id == rids[0] and out.text_delta:
                    yield out.text_delta

    def prompt_logits(self, prompts: list[list[int]]) -> list[torch.Tensor] | None:
        """Logits [len, V] of every token of each prompt, computed as one prefill lock-step outside
        the scheduler (parity checks); on rank 0 in prompt order, None elsewhere."""
        mine = self.mine(len(prompts))
        runner = self.engine.runner
        if mine:
            hidden = runner.forward_prompts([prompts[i] for i in mine])  # [T, D]
            rows = self.model.logits(hidden).cpu().split([len(prompts[i]) for i in mine])
        else:
            self.model.idle_forward()
            rows = []
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, list(zip(mine, rows)) if self.tp_rank == 0 else [], group=self.ctx.group)
        if self.rank != 0:
            return None
        return [t for _, t in sorted((pair for part in gathered for pair in part), key=lambda p: p[0])]

    def step(self) -> list[RequestOutput] | None:
        """One lock-step of every rank; None once no rank has work left."""
        busy = torch.tensor([int(self.engine.has_unfinished())], device=self.ctx.device)
        dist.all_reduce(busy, op=dist.ReduceOp.MAX, group=self.ctx.group)
        if not busy.item():
            return None
        return self.lockstep()

    def lockstep(self) -> list[RequestOutput]:
        """This rank's part of one lock-step every rank takes (the caller agreed on it with the others):
        the engine's step where it has work, the empty forward where it has none."""
        self.steps += 1
        if self.observer is not None:
            self.observer.lockstep_begin()
        outputs: list[RequestOutput] = []
        ran = sum(self.engine.stats.steps.values())
        if self.engine.has_unfinished():
            outputs = self.engine.step()
        idle = sum(self.engine.stats.steps.values()) == ran  # nothing to compute here this step
        if idle:
            self.idle_steps += 1
            self.model.idle_forward()
        if self.observer is not None:
            self.observer.lockstep_end(idle)
        return outputs

    def _add(self, ids: list[list[int]], params: list[SamplingParams], index: list[int]) -> list[int]:
        """Queue this rank's requests; a request error on any rank is raised on every rank."""
        error, rids = "", []
        try:
            rids = self.generator._add_all(ids, params)
        except RequestError as exc:
            error = str(exc)
            if error.startswith("prompt ") and index:  # renumber from this rank's share to the caller's list
                local, _, rest = error.removeprefix("prompt ").partition(":")
                if local.isdigit() and int(local) < len(index):
                    error = f"prompt {index[int(local)]}:{rest}"
        errors: list = [None] * self.world
        dist.all_gather_object(errors, error, group=self.ctx.group)
        first = next((e for e in errors if e), "")
        if first:
            for rid in rids:
                self.engine.abort(rid)
            raise RequestError(first)
        return rids


def check_parallel(cfg: RunConfig) -> None:
    """Every user mistake in `parallel` raised before any rank starts (placement, sizes, files)."""
    if cfg.engine_refusal():  # a serving engine's mesh / disaggregation (config.DeployConfig)
        raise MoetuneError(cfg.engine_refusal())
    model_dir = resolve_model(cfg.model.path)
    spec = read_spec(model_dir)
    resolve_placement(cfg.parallel, spec)
    check_tp(spec, cfg.parallel.tp_size, cfg.parallel.expert_tp)
    check_dense(dense_format(read_block(model_dir)), cfg.quant.dense if cfg.quant is not None else None,
                cfg.parallel.group_size)


def run_ranks(cfg: RunConfig, job: Callable[[DPGenerator], T]) -> T | None:
    """Build a DPGenerator on each rank of the mesh (parallel.ep_size × G ranks) and call `job` on
    each (a picklable callable: spawned ranks receive it); rank 0's result, None in other ranks' processes."""
    check_parallel(cfg)
    device = resolve_device(cfg.model.device)
    world = cfg.parallel.world
    if device.type == "cuda" and world > torch.cuda.device_count() and not under_torchrun():
        raise MoetuneError(f"the mesh of {describe_mesh(cfg)} = {world} ranks needs {world} GPUs; this machine has "
                           f"{torch.cuda.device_count()} (start it with torchrun across machines)")
    return launch(functools.partial(_rank_main, cfg, job), world, device, cfg.parallel.timeout_s,
                  cfg.parallel.group_size)


def describe_mesh(cfg: RunConfig) -> str:
    p = cfg.parallel
    return f"ep_size {p.ep_size} × tp group {p.group_size} (tp_size {p.tp_size}, expert_tp_size {p.expert_tp})"


def _rank_main(cfg: RunConfig, job: Callable[[DPGenerator], T], ctx: RankContext) -> T:
    return job(build_rank(cfg, ctx))


def build_rank(cfg: RunConfig, ctx: RankContext) -> DPGenerator:
    """This rank of the mesh: its process groups, its expert slots (EP) and weight slices (TP)."""
    par = cfg.parallel
    if par.world == 1:
        raise MoetuneError("a mesh of one rank: set parallel.ep_size or parallel.tp_size above 1")
    groups = join_mesh(Mesh.of(par), ctx.rank)
    target = resolve_target(cfg)  # once in this rank's process
    dispatcher = None
    if target.placement is not None and par.ep_size > 1:
        wire = None if par.dispatch_dtype == "auto" else torch_dtype(par.dispatch_dtype)
        dispatcher = AllToAllDispatcher(par.ep_size, groups.dp_rank, target.placement.slots_per_rank,
                                        groups.ep_group, wire)
    plan = plan_of(par.tp_size, par.expert_tp, groups.tp_rank)
    tp = None if plan is None else TPComm(plan, groups.tp_group, ctx.device)
    return DPGenerator(build_generator(target, groups.dp_rank, dispatcher, ctx.device, tp), ctx, groups)
