"""CPU threads of a process that runs a model: torch's intra-op pool and the numba CPU kernels.

Set once, by the command, before the model runs (`use_threads`, from `--threads`; default: the
cores this process may use, `os.sched_getaffinity`). Both pools are OpenMP: torch ships its own
libgomp, and numba's `omp` threading layer (which `moetune.kernels.cpu` selects) links against
the system's copy, so a process holds two OpenMP runtimes with a team of threads each. How their
threads wait between parallel regions (spinning or sleeping, `OMP_WAIT_POLICY`) is read when each
runtime loads, i.e. before torch is imported: `sleep_between_regions` (the CLI calls it first
thing) makes them sleep; docs/cpu.md has the reasons and the measurements.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


def sleep_between_regions() -> None:
    """OpenMP threads sleep as soon as a parallel region ends instead of spinning for a while
    (`OMP_WAIT_POLICY=PASSIVE`, unless the environment says otherwise). Effective only before torch
    (and numba) are imported. Spinning workers of one runtime steal the cores the other runtime's
    region, or another process, is waiting for; on a shared 2-core machine a decode step was 2-3×
    slower with them (docs/cpu.md)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and `taskset` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def use_threads(threads: int | None = None) -> int:
    """Run torch and the CPU kernels on `threads` threads (None: every available core); returns it.

    numba reads NUMBA_NUM_THREADS when it is first imported (after this, on the first kernel call),
    which makes it the default of every thread, the serving engine's included; if numba is already
    loaded, the calling thread's count is set instead."""
    import torch

    n = threads or available_cores()
    if n < 1:
        raise ValueError(f"threads must be ≥ 1, got {n}")
    torch.set_num_threads(n)
    if "numba" in sys.modules:  # (numba refuses a changed NUMBA_NUM_THREADS once its threads run)
        from moetune.kernels.cpu import set_threads

        set_threads(n)
    else:
        os.environ["NUMBA_NUM_THREADS"] = str(n)
    return n


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Inside the block, this thread runs torch and the CPU kernels on one thread (restored after):
    for an expert-parallel rank sharing the cores with the other ranks."""
    import numba
    import torch

    from moetune.kernels.cpu import runtime

    runtime.jit()  # numba loads with its default pool first, so that only this thread's count changes
    torch_before, kernels_before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(torch_before)
        numba.set_num_threads(kernels_before)
