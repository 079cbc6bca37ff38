"""env.json: what produced a run (model files hash, versions, git commit, device, machine state, topology)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from moetune.engine.heap import heap_policy
from moetune.engine.threads import wait_policy
from moetune.profile.machine import machine_state


def model_files_hash(model_dir: Path) -> str:
    """sha256 over the relative path and bytes of every file in the checkpoint directory."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(model_dir)).encode())
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def device_info(device: torch.device) -> dict:
    info = {"type": device.type, "cpu_count": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "cuda_device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if device.type == "cpu":
        from moetune.kernels.cpu import isa

        info["kernel_isa"] = isa.describe()  # the instruction set the CPU kernels compiled for (kernels/cpu/isa.py)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, total_memory_bytes=props.total_memory,
                    capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
    return info


def environment(model_dir: Path, device: torch.device, ep_size: int, ranks_per_node: int, ran: bool = False,
                fused: bool = False) -> dict:
    """ran: the run started ep_size ranks (otherwise its EP traffic is computed on one process);
    fused: the engine runs decode steps through the fused CPU layer kernels outside a profile."""
    return {
        "model_dir": str(model_dir),
        "model_files_sha256": model_files_hash(model_dir),
        "moetune_version": _version("moetune"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "torch_num_threads": torch.get_num_threads(),
        "openmp_wait": wait_policy(),  # spin or sleep between parallel regions (engine/threads.py)
        "malloc": heap_policy(),  # whether freed activation memory stays in the process (engine/heap.py)
        "decode_layers": ("unfused while profiled (each phase timed); outside a profile, decode steps run the fused "
                          "CPU layer kernels (model/fused_decode.py; `moetune profile --overhead` compares them)"
                          if fused else "unfused"),
        "device": device_info(device),
        "machine": machine_state(),  # load, threads, memory-read probe when the run was written (machine.py)
        "topology": {"ep_size": ep_size, "ranks_per_node": ranks_per_node,
                     "nodes": max(1, ep_size // ranks_per_node), "simulated": not ran,
                     "note": (f"ran on {ep_size} ranks; the what-if tables (ep_*) are computed for the same placement"
                              if ran else "EP traffic is computed from the recorded routing on one process")},
    }
