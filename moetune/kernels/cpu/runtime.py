"""Lazy access to the numba kernels and their thread count.

Nothing here imports numba at import time: the first `jit()` call imports `_jit` (numba compiles
each kernel on its first call for the given dtypes, then reuses the on-disk cache, `cache=True`,
which `_cache` keys on every kernel source, so an edited callee never leaves a caller stale).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from types import ModuleType

from moetune.kernels.cpu.arrays import fp32_cpu, numpy_view, ones

__all__ = ["compiled_signatures", "current_threads", "fp32_cpu", "jit", "jit_layer", "launch", "numpy_view", "ones",
           "set_threads"]

SERIAL_BYTES = 256 * 1024  # below this many weight bytes a call runs on one thread
INT8_ROW = True  # int8 weights against a single x row take the integer path (`_jit_q8`; A/B: docs/cpu.md)
Q8_ROWS = 16  # ... and against up to this many x rows (`linear`, the fused layer; 1: one row only)
Q4_INTERLEAVED = True  # int4 weights run the interleaved kernels (`q4r`, `_jit_q4r`, every row count);
# off: the int16 path below (Q4_ROWS) and the fp32 nibble split (docs/cpu.md)
Q4_X_PARTS_FEW = 2  # x on the interleaved kernels, per group: int8 parts, each the rounded residual of
Q4_X_PARTS = 3  # the ones before (1: 8 bits, llama.cpp's Q8_0; 2: ~16, the old int16 path's; 3: ~fp32's
# 24), in calls (experts) of up to 16 x rows (FEW: decode) and beyond (prefill)
Q4_SCALE_FP16_FEW = True  # the scales those calls read: fp16 (Q4_0's 18 bytes per 32 weights at g32, what
Q4_SCALE_FP16 = False  # decode streams), else fp32; the repacked copy holds the kinds read (`q4r.Scales`)
# Default (2, 3, fp16, fp32): docs/cpu.md's int4 quality rows to the last digit, decode reading Q4_0's
# bytes. llama.cpp's numerics: 1, 1, fp16, fp16 (int8 x, Q8_0 x Q4_0: moves the int4 rows in their last
# digits). Exact mode: 2, 3, fp32, fp32 (docs/cpu.md, "Exact mode").
Q4_ROWS = 16  # int4 weights against up to this many x rows take the integer path (`_simd`; 0: never)
# Measured end to end (docs/cpu.md): Q8_ROWS 16 1.09x at b=16; Q4_ROWS 1 / 16 1.80x at b=1, 1.31x at
# b=16. x is rounded per block of columns (`_jit_q8`), so tensor-parallel meshes equal one rank.
# Scheduling: numba's `omp` layer hands each thread one contiguous share of a prange's items, up
# front (measured: `numba.parallel_chunksize` changes the share's granularity, not who takes it), so
# the kernels order their work items such that equal shares are equal work.


@functools.cache
def jit() -> ModuleType:
    """The `_jit` module (imports numba on first use), compiled for the instruction set `isa.choose`
    picks (the host's best, or MOETUNE_CPU_ISA's)."""
    _choose_threading_layer()
    from moetune.kernels.cpu import isa

    isa.choose()
    return importlib.import_module("moetune.kernels.cpu._jit")


@functools.cache
def jit_layer() -> ModuleType:
    """The `_jit_layer` module: a decode layer's kernels strung into two calls (imports numba on first use)."""
    jit()
    return importlib.import_module("moetune.kernels.cpu._jit_layer")


def _choose_threading_layer() -> None:
    """numba's `omp` layer (GNU OpenMP), unless NUMBA_THREADING_LAYER says otherwise: safe to launch
    from several threads at once (`workqueue` aborts the process then), and it honours
    OMP_WAIT_POLICY like torch's own OpenMP runtime (a separate copy of libgomp: two teams of
    threads, which is why moetune's CLI makes both sleep between regions, docs/cpu.md). `tbb`,
    which numba prefers when installed, would add a third pool that ignores that setting."""
    import os

    import numba

    if os.environ.get("NUMBA_THREADING_LAYER"):
        return
    try:
        from numba.np.ufunc import omppool  # noqa: F401
    except ImportError:  # a numba built without OpenMP: its default order
        return
    numba.config.THREADING_LAYER = "omp"


def set_threads(threads: int | None) -> None:
    """Default threads for kernels launched from this thread (None: leave as is; numba starts with
    every core it sees; values above that are clamped to it)."""
    if threads is None:
        return
    import numba

    if threads < 1:
        raise ValueError(f"threads must be ≥ 1, got {threads}")
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


@contextlib.contextmanager
def launch(threads: int | None, weight_bytes: int) -> Iterator[ModuleType]:
    """with launch(threads, weight_bytes) as k: k.some_kernel(...) — the kernels, run with `threads`
    (None: numba's current default) for this call only. Calls on one thread (threads=1, or weights
    under SERIAL_BYTES: waking a second thread costs more than it saves, and much more on a busy
    machine) get the serial twins (`k.SERIAL` is then True), which loop over the same work items on
    the calling thread, so numba's thread count is left alone. Other counts are set only when they
    differ from the current one (each set costs a few µs, and a decode step launches ~50 kernels)."""
    k = jit()
    if threads == 1 or (threads is None and weight_bytes < SERIAL_BYTES):
        yield k.serial
        return
    if threads is None:  # the common case: no numba call at all (each costs µs, and tens of µs
        yield k  # on the caches a weight-streaming kernel just flushed)
        return
    import numba

    before = numba.get_num_threads()
    if threads != before:
        set_threads(threads)
    try:
        yield k
    finally:
        if threads != before:
            numba.set_num_threads(before)


def current_threads() -> int:
    """The threads a kernel launched now would use (inside `launch`: this call's)."""
    import numba

    return numba.get_num_threads()


def compiled_signatures() -> dict[str, int]:
    """Per numba kernel of moetune's modules loaded so far ("module.name"): the type signatures it
    holds, compiled or loaded from numba's disk cache. numba specialises a kernel on its first call
    with each new set of argument types (dtype, dimensions, layout: a strided slice is another
    signature than a contiguous array), so a count that grows between two reads means a call in
    between paid for a compile or a cache load ({} while numba is not loaded)."""
    import sys

    if "numba" not in sys.modules:
        return {}
    from numba.core.dispatcher import Dispatcher

    out: dict[str, int] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("moetune."):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Dispatcher):
                out[f"{value.py_func.__module__}.{value.py_func.__name__}"] = len(value.signatures)
    return out
