"""`run_profile`: load the model, run the workload with the Profiler attached, write the run dir."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from moetune.config import ParallelConfig, RunConfig, parse_config
from moetune.errors import MoetuneError
from moetune.profile.ep import placement_layout
from moetune.profile.workload import Workload, batches, load_prompt_texts, prompts_path, request_tokens


@dataclass(frozen=True)
class ProfileSettings:
    config: RunConfig
    workload: Workload = Workload()
    ep_size: int | None = None  # None: the recipe's parallel.ep_size
    ranks_per_node: int | None = None  # None: the recipe's parallel.ranks_per_node
    capacity_factor: float | None = None
    trace: bool = False  # torch.profiler trace into <run>/tb and <run>/trace.json
    out: Path | None = None  # None: runs/<model>-<timestamp>
    runs_root: Path = Path("runs")
    what_if: bool = False  # EP-R traffic computed on one process instead of running R ranks


@dataclass
class ProfileResult:
    path: Path
    summary: dict


Hooks = Callable[[str], None]


def run_profile(settings: ProfileSettings, on_start: Callable[[int], None] | None = None,
                on_step: Hooks | None = None) -> ProfileResult | None:
    """One process (R = 1, or the what-if of R ranks), or R ranks for real (rank_run.py). None in the
    processes of ranks other than 0 under torchrun: rank 0 alone writes the run dir."""
    w = settings.workload
    w.check()
    if settings.capacity_factor is not None and settings.capacity_factor <= 0:
        raise MoetuneError("--capacity-factor must be positive")
    texts = load_prompt_texts(prompts_path(w))  # user mistakes first, before heavy imports
    from moetune.engine.build import build_generator, resolve_placement
    from moetune.model.loader import read_spec
    from moetune.model.registry import resolve_model
    from moetune.profile.rundir import RunDirWriter

    model_dir = resolve_model(settings.config.model.path)
    spec = read_spec(model_dir)
    ep, rpn = _parallel(settings)
    parallel = {**settings.config.parallel.model_dump(), "ep_size": ep, "ranks_per_node": rpn}
    cfg = parse_config({**settings.config.model_dump(), "parallel": parallel,
                        "engine": engine_for(settings.config, w, texts, spec.max_position)}, source="command line")
    layout = placement_layout(resolve_placement(cfg.parallel, spec), spec.moe.num_experts, ep, rpn)
    writer = RunDirWriter(settings.out or settings.runs_root / f"{model_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if ep > 1 and not settings.what_if:
        from moetune.profile.ranks.run import run_rank_profile

        return run_rank_profile(settings, cfg, texts, writer, on_start, on_step)
    writer.check_free()
    generator = build_generator(cfg.model_copy(update={"parallel": ParallelConfig()}))  # one rank; EP is computed
    requests = request_tokens(texts, generator.encode, w)
    _check_lengths(requests, w, spec.max_position)
    if on_start is not None:
        on_start(min(w.warmup_steps, w.output_len) + w.measured_steps())
    with writer as tmp:
        summary = _profile_into(tmp, settings, cfg, generator, requests, layout, model_dir, on_step)
    return ProfileResult(writer.final, summary)


def engine_for(config: RunConfig, w: Workload, texts: list[str], context: int) -> dict:
    """The engine runs each group of `batch_size` requests as one static batch: one prefill step, then
    decodes, without prefix sharing. The KV pool holds that batch's sequences and no more: each at
    most prompt + output tokens, a prompt's tokens bounded (before tokenizing) by its UTF-8 bytes + 2."""
    engine = config.engine.model_dump()
    batch = w.real_batch_size
    prompt = w.input_len or max(len(t.encode("utf-8")) + 2 for t in texts[: w.num_requests])
    per_seq = -(-min(prompt + w.output_len, context) // engine["block_size"])
    return {**engine, "max_num_seqs": batch, "prefix_caching": False, "num_kv_blocks": batch * per_seq,
            "max_num_batched_tokens": max(engine["max_num_batched_tokens"], batch * min(prompt, context))}


def _parallel(settings: ProfileSettings) -> tuple[int, int]:
    par = settings.config.parallel
    ep = settings.ep_size if settings.ep_size is not None else par.ep_size
    rpn = settings.ranks_per_node if settings.ranks_per_node is not None else par.ranks_per_node
    if ep < 1 or rpn < 1:
        raise MoetuneError("--ep-size and --ranks-per-node must be at least 1")
    return ep, rpn


def _check_lengths(requests: list[list[int]], w: Workload, max_position: int) -> None:
    longest = max(len(r) for r in requests)
    if longest + w.output_len > max_position:
        raise MoetuneError(f"a prompt of {longest} tokens plus --output-len {w.output_len} exceeds the model's "
                           f"context of {max_position}; lower --input-len or --output-len")


def _profile_into(tmp: Path, settings: ProfileSettings, cfg: RunConfig, generator, requests, layout,
                  model_dir: Path, on_step: Hooks | None) -> dict:
    from moetune.profile.nvml import NvmlSampler
    from moetune.profile.probe import Profiler

    w, model = settings.workload, generator.model
    profiler = Profiler(model, annotate=settings.trace, on_step=on_step)
    groups = batches(requests, w.batch_size)
    with NvmlSampler(_cuda_index(model.device)) as nvml:
        profiler.attach(generator.engine)
        try:
            if w.warmup_steps:
                profiler.recording = False
                generator.generate(groups[0], greedy_params(min(w.warmup_steps, w.output_len)))
                profiler.recording = True
            if hasattr(model.experts, "reset_stats"):  # offload counters cover measured steps only
                model.experts.drain()
                model.experts.reset_stats()
            with _torch_trace(tmp if settings.trace else None, model.device):
                for group in groups:
                    generator.generate(group, greedy_params(w.output_len))
        finally:
            profiler.detach(generator.engine)
    return finish_run(tmp, settings, cfg, profiler, layout, nvml, model_dir, generator.engine.runner.cache.nbytes())


def greedy_params(max_tokens: int):
    from moetune.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _cuda_index(device) -> int:
    if device.type != "cuda" or device.index is None:
        return 0
    return device.index


@contextlib.contextmanager
def _torch_trace(root: Path | None, device):
    if root is None:
        yield
        return
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, on_trace_ready=tensorboard_trace_handler(str(root / "tb"))):
        yield
    written = sorted((root / "tb").glob("*.pt.trace.json"))  # the handler's file is a Chrome trace
    if written:
        try:  # the same file under a plain name; a hard link costs no space
            os.link(written[-1], root / "trace.json")
        except OSError:
            shutil.copyfile(written[-1], root / "trace.json")


def offload_summary(store) -> dict:
    """An offloading store's per-layer counters (hit rate, prefetch precision/recall, bytes per tier,
    offload_wait, resident bytes) and their totals; {"enabled": false} for a resident store."""
    if not hasattr(store, "stats"):
        return {"enabled": False}
    layers = {str(i): row for i, row in store.stats().items()}
    total = {k: sum(r[k] for r in layers.values()) for k in ("hits", "misses", "prefetch_issued", "prefetch_used",
                                                             "bytes_host", "bytes_disk", "offload_wait_s",
                                                             "resident_bytes")}
    looked = total["hits"] + total["misses"]
    total["hit_rate"] = total["hits"] / looked if looked else 1.0
    total["prefetch_precision"] = (total["prefetch_used"] / total["prefetch_issued"]
                                   if total["prefetch_issued"] else None)
    return {"enabled": True, "settings": store.settings.__dict__, "total": total, "layers": layers}


def finish_run(tmp: Path, settings: ProfileSettings, cfg: RunConfig, profiler, layout, nvml, model_dir: Path,
               kv_bytes: int) -> dict:
    """Write a run dir's contents into `tmp` from a Profiler's records (also used by serve's recording)."""
    from moetune.profile.rates import model_dims
    from moetune.profile.tables import build_tables

    dims = model_dims(profiler.model).as_dict()
    trace = profiler.trace()
    tables = build_tables(profiler.records, trace, layout, dims["D"] * dims["b_a"], nvml.table())
    return write_run(tmp, settings, cfg, RunParts(profiler.model, tables, trace, layout, nvml.summary(), kv_bytes),
                     model_dir)


@dataclass
class RunParts:
    """What a run dir is written from: rank 0's model (dims, memory), the tables, the routing."""

    model: object  # MoETransformer
    tables: object  # RunTables
    trace: object  # RoutingTrace
    layout: object  # EPLayout
    nvml_summary: dict
    kv_bytes: int
    ranks: dict | None = None  # runs on R ranks: dispatcher counters, wire row bytes, dispatch dtype


def write_run(tmp: Path, settings: ProfileSettings, cfg: RunConfig, parts: RunParts, model_dir: Path) -> dict:
    import yaml

    from moetune.profile.analysis import summarize
    from moetune.profile.env import environment
    from moetune.profile.memory import memory_breakdown
    from moetune.profile.rates import model_dims
    from moetune.profile.rundir import write_contents

    model, w, tables, layout = parts.model, settings.workload, parts.tables, parts.layout
    dims = model_dims(model).as_dict()
    summary = summarize(tables, dims, layout, settings.capacity_factor)
    max_tokens = int(tables.steps.tokens.max()) if len(tables.steps) else 0
    summary.update(
        model={"name": model_dir.name, "model_type": model.spec.model_type, "dtype": str(model.dtype).split(".")[-1],
               "device": str(model.device), **dims},
        workload={**asdict(w), "prompts": str(prompts_path(w))},
        parallel=parallel_summary(layout, parts.ranks),
        memory=memory_breakdown(model, parts.kv_bytes, max_tokens).as_dict(),
        nvml=parts.nvml_summary,
        offload=offload_summary(model.experts),
        trace_files=["tb/", "trace.json"] if settings.trace else [],
    )
    recipe = yaml.safe_dump(cfg.model_dump(), sort_keys=False)
    recipe += "# profile workload (not a RunConfig key):\n" + "".join(
        f"#   {k}: {v}\n" for k, v in summary["workload"].items())
    env = environment(model_dir, model.device, layout.ep_size, layout.ranks_per_node, ran=parts.ranks is not None,
                      fused=model.fused is not None)
    write_contents(tmp, recipe, env, summary, tables, parts.trace)
    return summary


def parallel_summary(layout, ranks: dict | None) -> dict:
    """summary.json `parallel`: the layout; with R ranks run for real, what they measured too."""
    out = {"ep_size": layout.ep_size, "ranks_per_node": layout.ranks_per_node, "placement": layout.policy,
           "ran_ranks": ranks is not None, "token_origin": "token t of a step on rank t % R"}
    if layout.slots is None:
        out["placement_experts"] = layout.placement.tolist()
    else:
        out.update(redundant_experts=layout.slots.redundant, slots_per_rank=layout.slots.slots_per_rank,
                   physical_to_logical=layout.slots.phy2log.tolist(),
                   replica_split="copy of token t (its index on its rank) goes to replica t mod replicas")
    if ranks is not None:
        out.update(token_origin="request i of a batch on rank i % R (data-parallel attention); routing.npz token_rank",
                   **ranks)
    return out
