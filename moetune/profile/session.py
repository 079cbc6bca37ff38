"""What a profile run on one process (runner.py) and its twin on R ranks (ranks/run.py) share, in one
place: the settings and result, the checks, the NVML device index, the torch.profiler trace and the
parts a run dir is written from (finish.py writes them)."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from moetune.config import RunConfig
from moetune.errors import MoetuneError
from moetune.profile.workload import Workload


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
    target: object = None  # engine.target.Target resolved once by the caller (None: resolved from `config`)


@dataclass
class ProfileResult:
    path: Path
    summary: dict


Hooks = Callable[[str], None]


def parallel_sizes(settings: ProfileSettings) -> tuple[int, int]:
    """(R, ranks per node). Ranks per node: the flag, else a recipe's value other than the default 1,
    else where the ranks really are: ranks this command starts share this machine (one node),
    torchrun's share LOCAL_WORLD_SIZE per node; a what-if models the recipe's cluster (1 by default)."""
    par = settings.config.parallel
    ep = settings.ep_size if settings.ep_size is not None else par.ep_size
    rpn = settings.ranks_per_node if settings.ranks_per_node is not None else par.ranks_per_node
    if settings.ranks_per_node is None and par.ranks_per_node == 1 and ep > 1 and not settings.what_if:
        from moetune.engine.torchrun import under_torchrun

        local = int(os.environ.get("LOCAL_WORLD_SIZE", ep)) if under_torchrun() else ep
        rpn = local if local >= 1 and (ep % local == 0 or local % ep == 0) else 1
    if ep < 1 or rpn < 1:
        raise MoetuneError("--ep-size and --ranks-per-node must be at least 1")
    return ep, rpn


def check_lengths(requests: list[list[int]], w: Workload, max_len: int, words: str = "the model's context") -> None:
    """Every request's prompt plus --output-len within the engine's context of max_len (`words` names it:
    engine/limits.py's context_words)."""
    longest = max(len(r) for r in requests)
    if longest + w.output_len > max_len:
        raise MoetuneError(f"a prompt of {longest} tokens plus --output-len {w.output_len} exceeds {words} of "
                           f"{max_len}; lower --input-len or --output-len")


def greedy_params(max_tokens: int):
    from moetune.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def cuda_index(device) -> int:
    if device.type != "cuda" or device.index is None:
        return 0
    return device.index


@contextlib.contextmanager
def torch_trace(root: Path | None, device, final: Path | None = None):
    """A torch.profiler trace of the block into root/tb (TensorBoard) and root/trace.json; yields the
    `step` to call as each engine step begins (ProfilerStep#N, TensorBoard's steps: #0 opens with the
    trace, so the first call only counts), or None.
    The trace's traceName names where it will be: `final` (the run directory root becomes)."""
    if root is None:
        yield None
        return
    from torch.profiler import ProfilerAction, ProfilerActivity, profile, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # a schedule that records every step: one trace, and a ProfilerStep#N range per prof.step()
    with profile(activities=activities, schedule=lambda step: ProfilerAction.RECORD,
                 on_trace_ready=tensorboard_trace_handler(str(root / "tb"))) as prof:
        begun = []

        def step() -> None:
            if begun:
                prof.step()
            begun.append(True)

        yield step
    written = sorted((root / "tb").glob("*.pt.trace.json"))  # the handler's file is a Chrome trace
    if written:
        _name_trace(written[-1], root, final or root)
        try:  # the same file under a plain name; a hard link costs no space
            os.link(written[-1], root / "trace.json")
        except OSError:
            shutil.copyfile(written[-1], root / "trace.json")


def _name_trace(path: Path, root: Path, final: Path) -> None:
    """traceName: the trace's path once the run directory is in place (not the temporary one)."""
    import json

    data = json.loads(path.read_text())
    data["traceName"] = str(Path(final).absolute() / path.relative_to(root))
    path.write_text(json.dumps(data))


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
    speculative: dict | None = None  # speculative-decoding counters over the measured steps (engine.speculative)
    speculative_by_batch: list[dict] | None = None  # plain vs speculative decoding per batch size (specsweep.py)
