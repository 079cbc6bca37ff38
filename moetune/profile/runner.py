"""`run_profile`: load the model, run the workload with the Profiler attached, write the run dir."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from moetune.config import ParallelConfig, RunConfig, parse_config
from moetune.errors import MoetuneError
from moetune.profile.ep import placement_layout
from moetune.profile.finish import finish_run, write_run
from moetune.profile.session import (Hooks, ProfileResult, ProfileSettings, check_lengths, cuda_index, greedy_params,
                                     parallel_sizes, torch_trace)
from moetune.profile.workload import Workload, batches, load_prompt_texts, prompts_path, request_tokens


def run_profile(settings: ProfileSettings, on_start: Callable[[int], None] | None = None,
                on_step: Hooks | None = None) -> ProfileResult | None:
    """One process (R = 1, or the what-if of R ranks), or R ranks for real (ranks/run.py). None in the
    processes of ranks other than 0 under torchrun: rank 0 alone writes the run dir."""
    w = settings.workload
    w.check()
    if settings.capacity_factor is not None and settings.capacity_factor <= 0:
        raise MoetuneError("--capacity-factor must be positive")
    texts = load_prompt_texts(prompts_path(w))  # user mistakes first, before heavy imports
    from moetune.engine.build import build_generator
    from moetune.engine.limits import context_words
    from moetune.engine.target import resolve_target
    from moetune.profile.rundir import RunDirWriter

    target = settings.target or resolve_target(settings.config)  # the command resolved it once (cli/profile.py)
    model_dir, spec = target.model_dir, target.spec
    ep, rpn = parallel_sizes(settings)
    parallel = {**settings.config.parallel.model_dump(), "ep_size": ep, "ranks_per_node": rpn}
    cfg = parse_config({**settings.config.model_dump(), "parallel": parallel,
                        "engine": engine_for(settings.config, w, texts, target.max_len)}, source="command line")
    target = target.with_config(cfg)  # the same checkpoint; the placement of the run's parallel
    layout = placement_layout(target.placement, spec.moe.num_experts, ep, rpn)
    writer = RunDirWriter(settings.out or settings.runs_root / f"{model_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if (ep > 1 and not settings.what_if) or cfg.parallel.group_size > 1:  # TP always runs its ranks
        from moetune.profile.ranks.run import run_rank_profile

        return run_rank_profile(settings, cfg, texts, writer, write_run, on_start, on_step)
    writer.check_free()
    p = cfg.parallel  # EP is computed; the capacity runs as the recipe sets it
    one_rank = target.with_config(cfg.model_copy(update={"parallel": ParallelConfig(
        capacity_factor=p.capacity_factor, capacity_policy=p.capacity_policy)}))
    generator = build_generator(one_rank)
    requests = request_tokens(texts, generator.encode, w)
    check_lengths(requests, w, generator.engine.max_len, context_words(cfg.engine, spec.max_position))
    if on_start is not None:
        on_start(min(w.warmup_steps, w.output_len) + w.measured_steps())
    with writer as tmp:
        summary = _profile_into(tmp, settings, cfg, generator, requests, layout, model_dir, on_step, writer.final)
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


def _profile_into(tmp: Path, settings: ProfileSettings, cfg: RunConfig, generator, requests, layout,
                  model_dir: Path, on_step: Hooks | None, final: Path | None = None) -> dict:
    from moetune.engine.build import capacity_counts
    from moetune.engine.speculative.experts import speculative_counters
    from moetune.profile.nvml import NvmlSampler
    from moetune.profile.probe import Profiler

    w, model = settings.workload, generator.model
    profiler = Profiler(model, annotate=settings.trace, on_step=on_step)
    groups = batches(requests, w.batch_size)
    with NvmlSampler(cuda_index(model.device)) as nvml:
        profiler.attach(generator.engine)
        try:
            if w.warmup_steps:
                profiler.recording = False
                generator.generate(groups[0], greedy_params(min(w.warmup_steps, w.output_len)))
                profiler.recording = True
            model.experts.drain()  # the store's counters (offloading) cover measured steps only
            model.experts.reset_stats()
            capacity_counts(model, reset=True)  # so are the capacity's dropped / buffered copies
            engine = generator.engine
            before = speculative_counters(engine.stats, engine.runner.experts)
            with torch_trace(tmp if settings.trace else None, model.device, final) as step:
                profiler.trace_step = step
                for group in groups:
                    generator.generate(group, greedy_params(w.output_len))
            after = speculative_counters(engine.stats, engine.runner.experts)
        finally:
            profiler.detach(generator.engine)
    spec, sweep = None, None
    if engine.speculator is not None:
        from moetune.bench.roofline import expert_bytes
        from moetune.profile.specsweep import speculation_sweep

        spec = {k: after[k] - before[k] for k in after}
        sweep = speculation_sweep(engine, requests, w.output_len, w.batch_size, expert_bytes(model))
    return finish_run(tmp, settings, cfg, profiler, layout, nvml, model_dir, engine.runner.cache.nbytes(), spec, sweep)


