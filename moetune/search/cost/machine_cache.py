"""Where this machine's calibration is kept between runs, and the fingerprint it is kept under.

A calibration (microbench.py) is a fact about one machine running one software stack: the CPU
model, the cores this process may use, the threads it runs with, the torch and numba versions and
the kernel backend. `fingerprint()` collects those; a calibration is stored under a hash of the
fingerprint and of what was measured (the model's shapes, the shape buckets), so a changed machine
or stack measures again instead of reusing figures that are not its own.

The cache lives in `$MOETUNE_CACHE_DIR` when set (tests point it at a temporary directory), else
`$XDG_CACHE_HOME/moetune`, else `~/.cache/moetune`; one JSON file per key under `calibration/`,
written to a temporary name and renamed (never half-written).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

CACHE_ENV = "MOETUNE_CACHE_DIR"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "moetune"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(kernel_backend: str) -> dict:
    """What the measured figures depend on besides the model (a change of any one re-measures)."""
    import torch

    from moetune.engine.threads import available_cores

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {"cpu": cpu_model(), "cores": available_cores(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "numba": version("numba"), "kernel_backend": kernel_backend,
            "moetune": version("moetune")}


def cache_key(fp: dict, what: dict) -> str:
    blob = json.dumps({"machine": fp, "measured": what}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cache_path(key: str) -> Path:
    return cache_dir() / "calibration" / f"{key}.json"


def load_entry(key: str) -> dict | None:
    """The stored calibration under `key`, or None (absent or unreadable: it is measured again)."""
    path = cache_path(key)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) else None


def store_entry(key: str, entry: dict) -> Path | None:
    """Write atomically; a cache that cannot be written (read-only home) is skipped, not an error."""
    path = cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entry, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        return None
    return path
