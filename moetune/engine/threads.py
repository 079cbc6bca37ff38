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


SERVER_READS = 25  # `moetune serve` reads the runnable count this many times at its start ...
SERVER_GAP_S = 0.04  # ... this far apart (~1 s in all) ...
SERVER_BUSY_SHARE = 0.8  # ... and sleeps only where at least this share of the reads saw a busy machine
_chosen: list[str] = []  # why choose_wait_policy decided as it did in this process (wait_policy's report)


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

    `server` (`moetune serve`, which runs for hours): busy only where the machine stays busy over
    ~1 s at its start (`sustained_busy`), so that a load that passes (a build's last seconds, the
    server it replaced winding down) does not make it sleep for the hours after; a benchmark's
    client waiting for it to start is not runnable, and one process alone is not "busy" on 2 cores.
    The stakes on the 2-vCPU EPYC (bench-serve at C = 1, docs/cpu.md): quiet, spin 785-799 out
    tok/s against sleep's 407-480; beside 3 busy processes, spin 62, sleep 180."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        _chosen[:] = []
        return "environment"
    if server:
        seen = sustained_busy()
        _chosen[:] = [f"a server's: {seen[0]} of {seen[1]} reads over 1 s at start saw a busy machine"] if seen else []
        busy = seen is not None and seen[0] >= SERVER_BUSY_SHARE * seen[1]
    else:
        _chosen[:] = []
        busy = machine_busy()
    if busy:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "sleep"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return "spin"


def sustained_busy(reads: int = SERVER_READS, gap_s: float = SERVER_GAP_S) -> tuple[int, int] | None:
    """(reads that saw at least as many other runnable tasks as this process's cores, reads), over
    `reads` single reads of /proc/loadavg `gap_s` apart; None where the count is not there."""
    cores, busy = available_cores(), 0
    for i in range(reads):
        others = runnable_others(reads=1)
        if others is None:
            return None
        busy += others >= cores
        if i + 1 < reads:
            time.sleep(gap_s)
    return busy, reads


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
    why = "".join(f"; {note}" for note in _chosen)
    if "OMP_WAIT_POLICY" in os.environ:
        policy = os.environ["OMP_WAIT_POLICY"].upper()
        return f"{'sleep' if policy == 'PASSIVE' else 'spin'} (OMP_WAIT_POLICY={policy}{why})"
    if "GOMP_SPINCOUNT" in os.environ:
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
