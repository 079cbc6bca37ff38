"""A run dir written from its parts: the summary (analysis.py), the environment, memory, offload and
parallel sections, the recipe and the tables. Used by the one-process run (runner.py), handed to the
R-rank run (ranks/run.py, which sits below it) and by serve's recording."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from moetune.config import RunConfig
from moetune.profile.session import ProfileSettings, RunParts
from moetune.profile.workload import prompts_path


def offload_summary(store) -> dict:
    """An offloading store's per-layer counters (hit rate, prefetch precision/recall, bytes per tier,
    offload_wait, resident bytes) and their totals; {"enabled": false} for a resident store."""
    layers = {str(i): row for i, row in store.stats().items()}
    if not layers:
        return {"enabled": False}
    total = {k: sum(r[k] for r in layers.values()) for k in ("hits", "misses", "prefetch_issued", "prefetch_used",
                                                             "bytes_host", "bytes_disk", "offload_wait_s",
                                                             "resident_bytes")}
    looked = total["hits"] + total["misses"]
    total["hit_rate"] = total["hits"] / looked if looked else 1.0
    total["prefetch_precision"] = (total["prefetch_used"] / total["prefetch_issued"]
                                   if total["prefetch_issued"] else None)
    total["prefetch_by_source"] = source_totals(list(layers.values()))
    return {"enabled": True, "settings": store.settings.__dict__, "total": total, "layers": layers}


def capacity_applied(model, cfg: RunConfig) -> dict:
    """The recipe's capacity as it ran (parallel.capacity_policy): copies dropped, rerouted and
    buffered (computed in the second pass, whose time is the phase `overflow`) over the measured
    steps; {"policy": "none"} without one. (`--capacity-factor` alone only counts, in `kinds`.)"""
    from moetune.engine.build import capacity_counts

    p = cfg.parallel
    if p.capacity_policy == "none":
        return {"policy": "none"}
    return {"policy": p.capacity_policy, "factor": p.capacity_factor, **capacity_counts(model)}


def source_totals(rows: list[dict]) -> dict:
    """Per prefetch source (router-ahead, history): issued, used, hits over layers; precision =
    used / issued, recall = hits / (prefetch hits + misses)."""
    wanted = sum(r["misses"] for r in rows) + sum(sum(x["hits"] for x in r["prefetch_by_source"].values())
                                                  for r in rows)
    out = {}
    for src in rows[0]["prefetch_by_source"] if rows else ():
        n = {k: sum(r["prefetch_by_source"][src][k] for r in rows) for k in ("issued", "used", "hits")}
        out[src] = {**n, "precision": n["used"] / n["issued"] if n["issued"] else None,
                    "recall": n["hits"] / wanted if wanted else None}
    return out


def quant_summary(model) -> dict:
    """The routed experts' formats: {"formats": {name: layer × expert count}} (empty: the load dtype)."""
    return {"formats": model.precision.counts() if model.precision is not None else {}}


def finish_run(tmp: Path, settings: ProfileSettings, cfg: RunConfig, profiler, layout, nvml, model_dir: Path,
               kv_bytes: int, speculative: dict | None = None, by_batch: list[dict] | None = None) -> dict:
    """Write a run dir's contents into `tmp` from a Profiler's records (also used by serve's recording)."""
    from moetune.profile.rates import model_dims
    from moetune.profile.tables import build_tables

    dims = model_dims(profiler.model).as_dict()
    trace = profiler.trace()
    tables = build_tables(profiler.records, trace, layout, dims["D"] * dims["b_a"], nvml.table())
    return write_run(tmp, settings, cfg, RunParts(profiler.model, tables, trace, layout, nvml.summary(), kv_bytes,
                                                  speculative=speculative, speculative_by_batch=by_batch), model_dir)


def write_run(tmp: Path, settings: ProfileSettings, cfg: RunConfig, parts: RunParts, model_dir: Path) -> dict:
    import yaml

    from moetune.bench.roofline import expert_bytes
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
        quant=quant_summary(model),
        capacity_applied=capacity_applied(model, cfg),
        speculative=_speculative(cfg, parts, expert_bytes(model)),
        trace_files=["tb/", "trace.json"] if settings.trace else [],
    )
    recipe = yaml.safe_dump(cfg.model_dump(), sort_keys=False)
    recipe += "# profile workload (not a RunConfig key):\n" + "".join(
        f"#   {k}: {v}\n" for k, v in summary["workload"].items())
    env = environment(model_dir, model.device, layout.ep_size, layout.ranks_per_node, ran=parts.ranks is not None,
                      fused=model.fused is not None)
    write_contents(tmp, recipe, env, summary, tables, parts.trace)
    return summary


def _speculative(cfg: RunConfig, parts: RunParts, expert_bytes: float) -> dict:
    """summary.json `speculative`: over the measured steps, and per batch size (`by_batch`, a run on
    one process: profile/specsweep.py)."""
    from moetune.engine.speculative.experts import speculative_summary

    if parts.speculative is None:
        return {"enabled": False}
    out = speculative_summary(cfg.engine.speculative, parts.speculative, expert_bytes)
    if parts.speculative_by_batch is not None:
        out["by_batch"] = parts.speculative_by_batch
    return out


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
