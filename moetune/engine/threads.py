"""CPU threads of a process that runs a model: torch's intra-op pool and the numba CPU kernels.

Set once, by the command, before the model runs (`use_threads`, from `--threads`; default: the
cores this process may use, `os.sched_getaffinity`). Both pools are OpenMP: torch ships its own
libgomp, and numba's `omp` threading layer (which `moetune.kernels.cpu` selects) links against
the system's copy, so a process holds two OpenMP runtimes with a team of threads each. How their
threads wait between parallel regions (spinning or sleeping, `OMP_WAIT_POLICY`) is read when each
runtime loads, i.e. before torch is imported: `choose_wait_policy` (the CLI calls it first thing)
lets them spin briefly on a quiet machine and sleep at once on a busy one; docs/cpu.md has the
reasons and the measurements.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator


SPIN_COUNT = 100_000  # libgomp spin iterations before an idle worker sleeps (a fraction of a millisecond)


SERVER_WAIT = "a server's, whatever the load at its start"  # why a server spins (wait_policy's report)
_chosen: list[str] = []  # how choose_wait_policy decided in this process: "server", "load" or "environment"


def choose_wait_policy(server: bool = False) -> str:
    """How the OpenMP threads of both runtimes (torch's, the CPU kernels') wait between parallel
    regions, set in the environment before torch and numba load them; returns "spin", "sleep" or
    "environment" (an `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` already set wins).

    A decode step runs dozens of short parallel regions with single-threaded work between them. On
    a quiet machine a worker that spins for a moment (`GOMP_SPINCOUNT`) takes the next region at
    once, and the main thread runs faster between regions too: 340M decode steps were ~13 % faster
    than with sleeping workers (docs/cpu.md). On a busy machine spinning workers take the cores
    other processes want and get descheduled mid-region: 2-3× slower there, so the threads sleep
    as soon as a region ends (`OMP_WAIT_POLICY=PASSIVE`). Busy means other runnable tasks at least
    as many as the cores this process may use, read once, at start (`machine_busy`).

    `server` (`moetune serve`): spin, without reading the load. A server runs for hours, and what
    runs beside it at its start (a benchmark's client, the server it replaced winding down, a build)
    says nothing of the load it will serve under; its own front end and clients it meets either way,
    and sleeping workers cost it 40-55 % of its tokens/s at C = 1 and 64 on 2 cores (docs/benchmarks.md). An
    `OMP_WAIT_POLICY=PASSIVE` in its environment still makes it sleep, where the machine stays busy."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        _chosen[:] = ["environment"]
        return "environment"
    _chosen[:] = ["server" if server else "load"]
    if not server and machine_busy():
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "sleep"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return "spin"


def machine_busy() -> bool:
    """Whether other work keeps every core of this process busy now: the tasks runnable right now
    other than this one (Linux: `runnable_others`), else the 1-minute load average. Not the load
    average where the count is there: it still counts work that ended seconds ago (measured here:
    ~1.9 on 2 cores right after a benchmark, which made the next one's threads sleep)."""
    others = runnable_others()
    if others is not None:
        return others >= available_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return False
    return load >= available_cores()


def runnable_others(path: str = "/proc/loadavg", reads: int = 5, gap_s: float = 0.002) -> float | None:
    """Runnable tasks besides this process's reading thread: the median over a few reads, ~10 ms
    apart in all, of the `running` count in /proc/loadavg (its fourth field, "running/total");
    None where that file is not there."""
    counts = []
    try:
        for i in range(reads):
            with open(path) as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
            if i + 1 < reads:
                time.sleep(gap_s)
    except (OSError, ValueError, IndexError):
        return None
    return statistics.median(counts)


def wait_policy() -> str:
    """The OpenMP wait setting this process runs with, for reports: "spin (GOMP_SPINCOUNT=N)",
    "sleep (OMP_WAIT_POLICY=PASSIVE)" and so on, from the environment."""
    if "OMP_WAIT_POLICY" in os.environ:
        policy = os.environ["OMP_WAIT_POLICY"].upper()
        return f"{'sleep' if policy == 'PASSIVE' else 'spin'} (OMP_WAIT_POLICY={policy})"
    if "GOMP_SPINCOUNT" in os.environ:
        why = f"; {SERVER_WAIT}" if _chosen == ["server"] else ""
        return f"spin (GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']}{why})"
    return "OpenMP default"


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and `taskset` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_kernel_isa() -> None:
    """A MOETUNE_CPU_ISA this CPU cannot run is the user's mistake: one line before the model loads."""
    if not os.environ.get("MOETUNE_CPU_ISA"):
        return
    from moetune.errors import UsageError
    from moetune.kernels.cpu import isa

    try:
        isa.requested()
    except isa.ISAError as exc:
        raise UsageError(str(exc)) from None


def use_threads(threads: int | None = None) -> int:
    """Run torch and the CPU kernels on `threads` threads (None: every available core); returns it.

    numba reads NUMBA_NUM_THREADS when it is first imported (after this, on the first kernel call),
    which makes it the default of every thread, the serving engine's included; if numba is already
    loaded, the calling thread's count is set instead."""
    import torch

    check_kernel_isa()
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
