"""What a profile run on one process (runner.py) and its twin on R ranks (ranks/run.py) share, in one
place: the settings and result, the checks, the NVML device index, the torch.profiler trace, and
writing the run dir from its parts (also used by serve's recording)."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from moetune.config import RunConfig
from moetune.errors import MoetuneError
from moetune.profile.workload import Workload, prompts_path


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


def parallel_sizes(settings: ProfileSettings) -> tuple[int, int]:
    par = settings.config.parallel
    ep = settings.ep_size if settings.ep_size is not None else par.ep_size
    rpn = settings.ranks_per_node if settings.ranks_per_node is not None else par.ranks_per_node
    if ep < 1 or rpn < 1:
        raise MoetuneError("--ep-size and --ranks-per-node must be at least 1")
    return ep, rpn


def check_lengths(requests: list[list[int]], w: Workload, max_position: int) -> None:
    longest = max(len(r) for r in requests)
    if longest + w.output_len > max_position:
        raise MoetuneError(f"a prompt of {longest} tokens plus --output-len {w.output_len} exceeds the model's "
                           f"context of {max_position}; lower --input-len or --output-len")


def greedy_params(max_tokens: int):
    from moetune.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def cuda_index(device) -> int:
    if device.type != "cuda" or device.index is None:
        return 0
    return device.index


@contextlib.contextmanager
def torch_trace(root: Path | None, device):
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
