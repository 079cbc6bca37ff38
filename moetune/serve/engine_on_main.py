"""`moetune serve` on one rank: the engine's loop on the main thread, uvicorn on a second one.

Why: the CPU kernels (numba's `omp` layer) and torch each run parallel regions on a GNU OpenMP team
that belongs to the thread launching them. The main thread launches some while the model loads, so
an engine stepping on another thread made a second team; libgomp then manages more threads than
the machine has cores and its idle workers spin only briefly (its "throttled" spin count) before
they sleep, so every region of a step waited for a woken thread. Measured in-process on the 2-vCPU
Xeon (docs/benchmarks.md): a batch-1 decode step 0.88 ms on the main thread alone, 0.92 ms on
another thread alone, 2.0 ms on either once both had launched. The engine therefore steps on the
thread that built the model, and the HTTP front end (pure Python and asyncio: it launches no
parallel region) runs beside it.

Signals: Python delivers them to the main thread only, and uvicorn installs its handlers only when
it runs there, so SIGTERM / SIGINT are forwarded here to the server's `handle_exit` (the first
starts the drain of shutdown.py, a second hurries it). The loop ends when the app's shutdown stops
the worker, or when uvicorn's thread ends for any reason (its failure is raised here).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def serve_on_main(server, worker, sockets: list) -> None:
    """Run uvicorn's `server` on a thread and `worker`'s loop (a CommandWorker) on this one, the main
    thread, until both end; re-raises what ended uvicorn's thread (a startup failure's SystemExit)."""
    worker.host()
    ended: list[BaseException] = []

    def http() -> None:
        try:
            server.run(sockets=sockets)
        except BaseException as exc:  # handed to the main thread
            ended.append(exc)
        finally:
            worker.stop(timeout=0)  # the app's shutdown did it already, unless uvicorn never started

    thread = threading.Thread(target=http, name="moetune-http", daemon=True)
    with forwarded_signals(server.handle_exit):
        thread.start()
        worker.run_hosted()
        while thread.is_alive():  # join with a timeout: signals still reach the handler meanwhile
            thread.join(0.1)
    if ended:
        raise ended[0]


@contextlib.contextmanager
def forwarded_signals(handler) -> Iterator[None]:
    """SIGINT and SIGTERM call `handler(sig, frame)` on the main thread inside the block (restored after)."""
    before = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
