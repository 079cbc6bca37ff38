"""Lazy access to the numba kernels and their thread count.

Nothing here imports numba at import time: the first `jit()` call imports `_jit` (numba compiles
each kernel on its first call for the given dtypes, then reuses the on-disk cache, `cache=True`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from types import ModuleType

CHUNK = 4  # work items a thread takes at a time: dynamic scheduling, so experts with more rows,
# or a core busy with another process, do not hold the other threads at the barrier


@functools.cache
def jit() -> ModuleType:
    """The `_jit` module (imports numba on first use)."""
    return importlib.import_module("moetune.kernels.cpu._jit")


def set_threads(threads: int | None) -> None:
    """Threads for the kernels launched from this thread (None: leave as is). numba's default is
    every core it sees; values above that are clamped to it."""
    if threads is None:
        return
    import numba

    if threads < 1:
        raise ValueError(f"threads must be ≥ 1, got {threads}")
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


@contextlib.contextmanager
def launch(threads: int | None) -> Iterator[ModuleType]:
    """with launch(threads) as k: k.some_kernel(...) — the kernels module, `threads` set and
    dynamic scheduling on for the parallel loops launched inside."""
    k = jit()
    set_threads(threads)
    import numba

    with numba.parallel_chunksize(CHUNK):
        yield k


def numpy_view(t):
    """A C-contiguous CPU tensor as a zero-copy numpy array."""
    return t.detach().contiguous().numpy()
