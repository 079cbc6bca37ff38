"""`moetune bench` assembled from a resolved Target: the recipe's deployment built once, the machine's
read-stream and matmul limits sampled, moetune's workloads timed (taking turns with transformers' on
the same weights when asked); on R expert-parallel ranks, each rank's engine timed in lock-step.
The command only parses, calls `run_bench` / `run_bench_ranks` and prints."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, ContextManager

from moetune.bench.roofline import Limits
from moetune.bench.throughput import BenchRow, BenchSettings

Status = Callable[[str], ContextManager]  # shows what runs now (the command's spinner); no-op by default


def _quiet(_what: str) -> ContextManager:
    return contextlib.nullcontext()


@dataclass
class BenchResult:
    rows: list[BenchRow]  # ours, then the reference's (with `against`)
    limits: Limits
    title: str  # model · dtype · device · threads (· speculative)
    precision: str = ""  # the format of each part timed (`bench/precision.py`)


def run_bench(target, settings: BenchSettings, against: str | None = None, status: Status = _quiet,
              on_workload=None) -> BenchResult:
    """target: engine.target.Target (R = 1). against: None or "transformers". on_workload: progress
    (bench_moetune's)."""
    from moetune.bench.roofline import LimitSampler
    from moetune.bench.throughput import bench_moetune
    from moetune.engine.build import build_model

    dev = target.device
    ours = build_model(target)  # the recipe's deployment: quant, offload, capacity
    with status("machine limits ..."):
        sampler = LimitSampler(dev)
        limits = sampler.limits()
    if against:  # both loaded, each workload's runs taking turns with the reference's
        from moetune.bench.hf_reference import load_transformers, plan_transformers
        from moetune.bench.throughput import bench_against, plan_moetune

        reference = load_transformers(target.model_dir, target.dtype, dev)
        plans, done = plan_moetune(ours, settings)
        with status("moetune and transformers, taking turns ..."):
            rows = bench_against(plans, plan_transformers(reference, ours.spec.vocab_size, settings, dev), dev,
                                 settings.runs, sampler)
        done()
    else:
        with status("moetune ..."):
            rows = bench_moetune(ours, settings, sampler, on_workload)
    from moetune.bench.precision import precision_line

    spec = f" · speculative {settings.speculative}" if settings.speculative else ""
    return BenchResult(rows, limits, f"{target.model_dir.name} · {target.dtype} · {dev} · {_threads(dev)}{spec}",
                       precision_line(ours))


def _threads(dev) -> str:
    import torch

    if dev.type == "cuda":
        return "GPU"
    from moetune.engine.heap import heap_policy
    from moetune.engine.threads import wait_policy
    from moetune.kernels.cpu import isa

    return (f"threads {torch.get_num_threads()} · OpenMP wait: {wait_policy()} · freed memory: {heap_policy()}"
            f" · CPU kernels: {isa.describe()}")


def run_bench_ranks(cfg, settings: BenchSettings) -> list | None:
    """The bench workloads on parallel.ep_size ranks (data-parallel attention): rank 0's EPBenchRows."""
    from moetune.bench.ep_throughput import bench_engine_config
    from moetune.config import parse_config
    from moetune.engine.distributed import run_ranks

    R = cfg.parallel.ep_size
    cfg = parse_config({**cfg.model_dump(), "engine": bench_engine_config(settings, R).model_dump()}, "command line")
    return run_ranks(cfg, functools.partial(_bench_rank, settings))


def _bench_rank(settings: BenchSettings, dp):
    from moetune.bench.ep_throughput import bench_ep

    return bench_ep(dp, settings)
