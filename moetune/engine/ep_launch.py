"""Start R expert-parallel ranks and run one job on each (torch.distributed: gloo on CPU, NCCL on GPU).

Under `torchrun` (RANK and WORLD_SIZE set) this process is one rank of torchrun's group. Otherwise
this process becomes rank 0 and spawns ranks 1..R-1 on this machine (a TCPStore on a free local
port is the rendezvous). Rank 0's job result is returned; other ranks return None. On CPU every
rank computes with one thread.

A dead rank never leaves the others hanging: collectives fail when a peer's connection closes, or
after `timeout_s`. Every rank bumps a heartbeat counter in the store twice a second; when a
collective fails, a rank names the ranks whose counter stopped (or rank 0, when the store it hosts
is gone) in a `RankFailure`, one line, naming a rank by its place in the mesh when there is tensor
parallelism ("rank 3 (EP rank 1, TP rank 1)"; engine/mesh.py) and never cut mid-word.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from moetune.engine.threads import single_threaded
from moetune.engine.torchrun import under_torchrun
from moetune.errors import MoetuneError

T = TypeVar("T")
HEARTBEAT_S = 0.5


class RankFailure(MoetuneError):
    """Another expert-parallel rank died or stopped answering."""


@dataclass(frozen=True)
class RankContext:
    rank: int
    world: int
    device: torch.device
    group: Any = None  # None: the default process group


@dataclass(frozen=True)
class _Rendezvous:
    host: str
    port: int
    world: int
    device: str  # "cpu" or "cuda"
    timeout_s: float
    torchrun: bool
    tp_group: int = 1  # G: ranks per tensor-parallel group (the mesh's coordinates name a rank)


def launch(job: Callable[[RankContext], T], world: int, device: torch.device, timeout_s: float = 120.0,
           tp_group: int = 1) -> T | None:
    """Run job on `world` ranks (`tp_group` G: ranks per TP group, to name a rank in the mesh); returns
    rank 0's result in rank 0's process, None in the others."""
    kind = "cuda" if device.type == "cuda" else "cpu"
    if under_torchrun():
        got = int(os.environ["WORLD_SIZE"])
        if got != world:
            raise MoetuneError(f"torchrun started {got} processes but the mesh (--ep-size × --tp-size) needs {world}; "
                               "make them equal")
        rv = _Rendezvous(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", 29500)),
                         world, kind, timeout_s, True, tp_group)
        return _run_rank(job, int(os.environ["RANK"]), rv)
    rv = _Rendezvous("127.0.0.1", _free_port(), world, kind, timeout_s, False, tp_group)
    return _spawn(job, rv)


def _spawn(job, rv: _Rendezvous):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = []
    with _child_env(rv.device):
        for rank in range(1, rv.world):
            proc = ctx.Process(target=_child_main, args=(job, rank, rv), name=f"moetune-rank{rank}")
            proc.start()
            procs.append(proc)
    try:
        with single_threaded() if rv.device == "cpu" else contextlib.nullcontext():
            result = _run_rank(job, 0, rv, procs)
    except BaseException:
        _stop(procs, grace_s=5.0)
        raise
    _stop(procs, grace_s=rv.timeout_s)
    failed = [(p, p.exitcode) for p in procs if p.exitcode not in (0, None)]
    if failed:
        proc, code = failed[0]
        raise RankFailure(f"{rank_name(_rank_of(proc), rv.tp_group)} exited {_exit_text(code)} after the run")
    return result


def _child_main(job, rank: int, rv: _Rendezvous) -> None:
    if rv.device == "cpu":
        torch.set_num_threads(1)
    parent = os.getppid()
    try:
        _run_rank(job, rank, rv)
    except MoetuneError as exc:
        if os.getppid() != parent:  # rank 0 (the command itself) is gone: nobody else will say why
            print(f"error: rank {rank}: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


def _run_rank(job, rank: int, rv: _Rendezvous, procs=()):
    if rv.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    try:
        _join_group(rv, rank, procs)
    except (RuntimeError, ValueError) as exc:
        raise RankFailure(f"{rank_name(rank, rv.tp_group)} could not join the group of ranks at {rv.host}:{rv.port} "
                          f"within {rv.timeout_s:.0f}s ({first_line(exc)})") from None
    beat = _Heartbeat(rv, rank)
    try:
        return job(RankContext(rank, rv.world, device))
    except RuntimeError as exc:  # a collective failed: find out who stopped
        culprit = _culprit(beat, procs, rv)
        if culprit is None:
            raise
        raise RankFailure(f"{culprit}; {rank_name(rank, rv.tp_group)} stopped ({first_line(exc)})") from None
    finally:
        beat.stop()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _join_group(rv: _Rendezvous, rank: int, procs) -> None:
    """init_process_group; rank 0 of a spawned group does it in a thread and watches its children,
    so a rank that dies while starting fails the command at once instead of at the timeout."""
    timeout = timedelta(seconds=rv.timeout_s)
    backend = "nccl" if rv.device == "cuda" else "gloo"

    def join() -> None:
        if rv.torchrun:
            dist.init_process_group(backend, timeout=timeout)
        else:
            store = dist.TCPStore(rv.host, rv.port, rv.world, is_master=rank == 0, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=rv.world, timeout=timeout)

    if not procs:
        return join()
    failure: list[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(join, failure), daemon=True, name="moetune-join")
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            name = rank_name(_rank_of(dead[0]), rv.tp_group)
            raise RankFailure(f"{name} exited {_exit_text(dead[0].exitcode)} while starting")
    if failure:
        raise failure[0]


def _capture(fn, failure: list) -> None:
    try:
        fn()
    except BaseException as exc:  # handed to the waiting thread
        failure.append(exc)


def _culprit(beat: "_Heartbeat", procs, rv: _Rendezvous) -> str | None:
    """Who made a collective fail: a spawned rank that exited, else a rank whose heartbeat stopped."""
    deadline = time.monotonic() + 4 * HEARTBEAT_S + 1.0
    while True:
        for proc in procs:
            if proc.exitcode is not None and proc.exitcode != 0:
                return f"{rank_name(_rank_of(proc), rv.tp_group)} exited {_exit_text(proc.exitcode)}"
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    stopped = beat.stopped_ranks()
    if stopped is None:
        return f"{rank_name(0, rv.tp_group)}, which hosts the rendezvous, is gone"
    if stopped:
        return f"{', '.join(rank_name(r, rv.tp_group) for r in stopped)} stopped responding"
    return None


class _Heartbeat:
    """A daemon thread adding 1 to `moetune/hb/<rank>` in the rendezvous store every HEARTBEAT_S."""

    def __init__(self, rv: _Rendezvous, rank: int):
        self.rank, self.world = rank, rv.world
        self._store = dist.TCPStore(rv.host, rv.port, rv.world, is_master=False,
                                    timeout=timedelta(seconds=3), wait_for_workers=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="moetune-heartbeat")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._store.add(f"moetune/hb/{self.rank}", 1)
            self._stop.wait(HEARTBEAT_S)

    def stopped_ranks(self) -> list[int] | None:
        """Ranks whose counter did not move over 4 beats; None when the store cannot be reached."""
        try:
            before = [self._store.add(f"moetune/hb/{r}", 0) for r in range(self.world)]
            time.sleep(4 * HEARTBEAT_S)
            after = [self._store.add(f"moetune/hb/{r}", 0) for r in range(self.world)]
        except Exception:
            return None
        return [r for r in range(self.world) if r != self.rank and after[r] == before[r]]

    def stop(self) -> None:
        self._stop.set()


def _stop(procs, grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(deadline - time.monotonic(), 0.1))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


@contextlib.contextmanager
def _child_env(device: str):
    """Spawned CPU ranks start with one OpenMP thread and one CPU-kernel thread each, and every
    spawned rank with torch's C++ log at ERROR: when rank 0 dies, each surviving rank's store
    client logged a warning with a 20-frame C++ stack (~100 lines) before the one line that says
    what happened (the parent's environment is restored)."""
    names = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a user's own setting wins
    if device == "cpu":
        os.environ.update({name: "1" for name in names[:2]})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_of(proc) -> int:
    return int(proc.name.removeprefix("moetune-rank"))


def _exit_text(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"(killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"(killed by signal {-code})"
    return f"with code {code}"


def rank_name(rank: int, tp_group: int = 1) -> str:
    """A rank as the user set the mesh up: "expert-parallel rank 1", or under tensor parallelism
    "rank 3 (EP rank 1, TP rank 1)" (engine/mesh.py: rank r sits at (r // G, r % G))."""
    if tp_group == 1:
        return f"expert-parallel rank {rank}"
    return f"rank {rank} (EP rank {rank // tp_group}, TP rank {rank % tp_group})"


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The error's first line without gloo's source location; a very long one ends at a word, with "…"."""
    text = str(exc).strip().splitlines()
    line = re.sub(r"^\[[^\]]*\]\s*", "", text[0]) if text else type(exc).__name__
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(" ,;:") + " …"
