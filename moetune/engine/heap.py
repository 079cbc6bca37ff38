"""Keep freed activation memory in the process instead of handing it back to the kernel (glibc).

torch takes CPU tensors from the C library's malloc. glibc serves blocks over its mmap threshold
(128 KiB at start, raised on the fly up to the largest block freed) with fresh `mmap`s and trims
the top of its heap once enough of it is free, so a prefill step's big activations (512 tokens ×
8 copies × 768 fp32 = 12.6 MB for the permuted rows alone) come back as untouched pages, and every
4 KiB of them costs a page fault (a VM exit here) when first written: ~49,000 faults per 512-token
prefill step of the Qwen3-MoE-style model of issue 13. With both thresholds raised, freed blocks
stay in the heap and the next step reuses them: no faults after the first step, and prefill steps
1.035x (340M) and 1.054x (Qwen3) faster in an in-process A/B (docs/cpu.md). The price is that the
process keeps its peak activation memory (up to TRIM_THRESHOLD of free heap) until it exits, as a
caching GPU allocator does.

`keep_freed_memory()` is called by the CLI before any work. It also writes the two settings into
the environment (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, which glibc reads when a
process starts), so spawned expert-parallel ranks start with them and `heap_policy()` can name
them in a run's records. An environment that sets glibc's malloc knobs itself (`MALLOC_*_` or a
`glibc.malloc` tunable) wins.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # blocks up to this size come from the heap (glibc's largest: 32 MiB)
TRIM_THRESHOLD = 1 << 30  # free heap kept before its top is returned to the kernel
_USER_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> str:
    """Raise glibc's mmap and trim thresholds in this process; returns "kept", "environment" (the
    user's own malloc settings stand) or "unavailable" (not glibc, or it refused)."""
    if any(k in os.environ for k in _USER_KNOBS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "environment"
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return "unavailable"
    # mmap threshold first: setting either one also stops glibc moving them on the fly
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "unavailable"
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)  # for processes started from here
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(TRIM_THRESHOLD)
    return "kept"


def heap_policy() -> str:
    """The malloc settings this process started with or took, for a run's records: "kept" (ours),
    "default", or the environment's own."""
    got = {k: os.environ[k] for k in _USER_KNOBS if k in os.environ}
    if not got:
        return "default"
    if got == {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}:
        return "kept"
    return ", ".join(f"{k}={v}" for k, v in got.items())


def _glibc_mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None  # musl and others: other allocators, other knobs
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt
