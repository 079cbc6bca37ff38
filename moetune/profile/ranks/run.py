"""`moetune profile --ep-size R`: the workload on R expert-parallel ranks for real.

Every rank (spawned here, or one of torchrun's) builds its share of the model, attaches a
`RankProfiler` and runs the same calls: the warm-up batch, then each batch of the workload through
`DPGenerator.generate` (request i of a batch on rank i % R, all ranks in lock-step). Then every
rank's `RankRecord` is gathered on rank 0, which alone merges them and writes the run dir: the
tables every run has (merged over ranks), the measured `rank_steps` / `rank_moe`, and the ep_*
what-if computed for the same placement from the merged routing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from moetune.config import RunConfig
from moetune.profile.session import (ProfileResult, ProfileSettings, RunParts, check_lengths, cuda_index,
                                     greedy_params, torch_trace)

WriteRun = Callable[[Path, ProfileSettings, RunConfig, RunParts, Path], dict]  # profile/finish.py:write_run


def run_rank_profile(settings: ProfileSettings, cfg: RunConfig, texts: list[str], writer, write: WriteRun,
                     on_start: Callable[[int], None] | None, on_step: Callable[[str], None] | None) -> ProfileResult | None:
    """`write` writes the run dir on rank 0 (handed down by runner.py: ranks/ sits below the summary it
    computes, which imports ranks/analysis.py)."""
    from moetune.engine.distributed import run_ranks
    from moetune.engine.torchrun import launching_rank

    if launching_rank() != 0:  # under torchrun: run this rank's share, write nothing
        run_ranks(cfg, RankJob(settings, cfg, texts, None, write))
        return None
    writer.check_free()
    w = settings.workload
    if on_start is not None:
        on_start(min(w.warmup_steps, w.output_len) + w.measured_steps())
    with writer as tmp:
        summary = run_ranks(cfg, RankJob(settings, cfg, texts, tmp, write, on_step, writer.final))
    return ProfileResult(writer.final, summary)


class RankJob:
    """Run on every rank (picklable: spawned ranks receive it without rank 0's progress hook; `write`, a
    module-level function, travels by name)."""

    def __init__(self, settings: ProfileSettings, cfg: RunConfig, texts: list[str], out: Path | None,
                 write: WriteRun, on_step: Callable[[str], None] | None = None, final: Path | None = None):
        self.settings, self.cfg, self.texts, self.out, self.on_step = settings, cfg, texts, out, on_step
        self.write, self.final = write, final  # final: where `out` will be (the trace's traceName)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "on_step": None}

    def __call__(self, dp) -> dict | None:
        import torch.distributed as dist

        from moetune.profile.nvml import NvmlSampler

        with NvmlSampler(cuda_index(dp.model.device)) as nvml:
            profiler = self._run(dp)
        record = profiler.record(wire_row_bytes(profiler.dispatcher, dp.model))
        record.coords = (dp.dp_rank, dp.tp_rank)
        record.speculative = profiler.speculative
        gathered: list | None = [None] * dp.world if dp.rank == 0 else None
        dist.gather_object(record, gathered, dst=0, group=dp.ctx.group)
        if dp.rank != 0:
            return None
        return finish_rank_run(self.out, self.settings, self.cfg, gathered, dp, nvml, self.write)

    def _run(self, dp):
        from moetune.engine.build import capacity_counts
        from moetune.engine.limits import context_words
        from moetune.engine.speculative.experts import speculative_counters
        from moetune.profile.ranks.probe import RankProfiler
        from moetune.profile.workload import batches, request_tokens

        w, rank0 = self.settings.workload, dp.rank == 0
        requests = request_tokens(self.texts, dp.generator.encode, w)
        words = context_words(self.cfg.engine, dp.model.spec.max_position)
        check_lengths(requests, w, dp.engine.max_len, words)
        groups = batches(requests, w.batch_size)
        profiler = RankProfiler(dp.model, dispatcher_of(dp.model), dp.rank, self.settings.trace and rank0,
                                self.on_step if rank0 else None)
        profiler.attach(dp)
        try:
            if w.warmup_steps:
                profiler.recording = False
                dp.generate(groups[0], greedy_params(min(w.warmup_steps, w.output_len)))
            profiler.start_measuring()
            capacity_counts(dp.model, reset=True)  # summary capacity_applied: this rank's measured copies
            engine = dp.engine
            before = speculative_counters(engine.stats, engine.runner.experts)
            with torch_trace(self.out if self.settings.trace and rank0 else None, dp.model.device,
                             self.final) as step:
                profiler.trace_step = step
                for group in groups:
                    dp.generate(group, greedy_params(w.output_len))
            after = speculative_counters(engine.stats, engine.runner.experts)
            profiler.speculative = {k: after[k] - before[k] for k in after} if engine.speculator is not None else None
        finally:
            profiler.detach(dp)
        return profiler


def dispatcher_of(model):
    from moetune.moe.layer import MoELayer

    return next(layer.mlp.dispatcher for layer in model.layers if isinstance(layer.mlp, MoELayer))


def wire_row_bytes(dispatcher, model) -> int:
    """Bytes of one dispatched row: D · the wire dtype (the model dtype unless dispatch_dtype is set)."""
    dtype = dispatcher.wire_dtype or model.dtype
    return model.spec.hidden_size * dtype.itemsize


def finish_rank_run(tmp: Path, settings: ProfileSettings, cfg: RunConfig, ranks: list, dp, nvml,
                    write: WriteRun) -> dict:
    """Rank 0: merge every rank's record, compute the what-if for the run's placement, write the run dir."""
    from moetune.engine.mesh import Mesh
    from moetune.engine.target import resolve_placement
    from moetune.model.registry import resolve_model
    from moetune.profile.ep import placement_layout
    from moetune.profile.ranks.merge import merge_records, merged_trace
    from moetune.profile.ranks.tables import rank_moe_table, rank_steps_table
    from moetune.profile.ranks.tp import leaders, rank_tp_table, tp_summary
    from moetune.profile.rates import model_dims
    from moetune.profile.tables import build_tables

    model, par = dp.model, cfg.parallel
    moe_layers, E = list(model.spec.moe_layers), model.spec.moe.num_experts
    layout = placement_layout(resolve_placement(par, model.spec), E, par.ep_size, par.ranks_per_node)
    streams = leaders(ranks)  # one rank per DP group: the G ranks of a TP group share its tokens
    rec = merge_records(streams, moe_layers, E)
    trace = merged_trace(streams, rec, moe_layers, E)
    dims = model_dims(model).as_dict()
    tables = build_tables(rec, trace, layout, dims["D"] * dims["b_a"], nvml.table(), rank_steps_table(ranks),
                          rank_moe_table(streams, layout, moe_layers))
    measured = {"dispatch_dtype": par.dispatch_dtype, "wire_row_bytes": ranks[0].row_bytes,
                "dispatcher_counters": [{"rank": r.rank, **r.counters} for r in ranks],
                "mesh": Mesh.of(par).describe()}
    tp_table = rank_tp_table(ranks) if par.group_size > 1 else None
    if tp_table is not None:
        measured["tp"] = tp_summary(tp_table, ranks)
        tp_table.to_parquet(tmp / "rank_tp.parquet", index=False)
    parts = RunParts(model, tables, trace, layout, nvml.summary(), dp.engine.runner.cache.nbytes(), measured,
                     _speculative(streams))
    return write(tmp, settings, cfg, parts, resolve_model(cfg.model.path))


def _speculative(streams: list) -> dict | None:
    """The DP groups' speculative counters summed (one record per group: its TP ranks count alike)."""
    counts = [r.speculative for r in streams if r.speculative is not None]
    return {k: sum(c[k] for c in counts) for k in counts[0]} if counts else None
