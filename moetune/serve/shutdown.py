"""Shutdown in the right order: the app's drain first, then uvicorn's own.

uvicorn's graceful shutdown waits `timeout_graceful_shutdown` and then cancels the handlers, so a
non-streaming request got a plain-text 500 and a stream was cut without an error event, with
CancelledError tracebacks in the log. `DrainingServer` runs the drain before it: stop accepting,
mark the server draining (new requests and /health get 503), give in-flight requests
`drain_timeout_s`, then abort what still runs through the engine worker, so that every remaining
request answers the documented 503 error object (a stream: an error event and `data: [DONE]`);
only then does uvicorn's shutdown run, with nothing left to cancel.

A second SIGTERM or Ctrl-C hurries it (`handle_exit`): the drain stops waiting, what still runs
is aborted at once (the same 503s, error events and `[DONE]`), and the app's own shutdown (the
engine thread's stop) runs even though uvicorn skips it on a forced exit, so that no task is left
for the event loop to cancel (that was the CancelledError traceback). The exit status is the same.

After a fatal failure (the engine cannot step, a rank died) `stop_after_grace` keeps the socket
open for FATAL_GRACE_S, answering 503 to new requests (and /health), so that a client or load
balancer sees the documented 503 rather than a refused connection, then stops the server, which
exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import uvicorn

log = logging.getLogger("moetune.serve")
ANSWER_S = 5.0  # after the abort: time for the 503s and final events to be written
FATAL_GRACE_S = 1.0  # after a fatal failure: new requests answered 503 this long, then the server stops


def stop_after_grace(server: uvicorn.Server, state) -> None:
    """A fatal failure: new requests get 503 at once, the server stops FATAL_GRACE_S later (any thread;
    uvicorn's loop reads `should_exit` every 0.1 s)."""
    state.draining = True
    timer = threading.Timer(FATAL_GRACE_S, lambda: setattr(server, "should_exit", True))
    timer.daemon = True
    timer.start()


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state, drain_timeout_s: float):
        super().__init__(config)
        self.state, self.drain_timeout_s = state, drain_timeout_s

    def handle_exit(self, sig, frame) -> None:
        """The first SIGTERM / SIGINT starts the drain, any later one hurries it (uvicorn's own: only
        a second SIGINT)."""
        if not self.should_exit:
            self.should_exit = True
        elif not self.force_exit:
            log.warning("a second signal: stopping at once, aborting what still runs")
            self.force_exit = True

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:  # stop accepting (uvicorn's shutdown does it again, harmlessly)
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive connections close; busy ones close after their answer
        await drain(self.state, self.drain_timeout_s, hurry=lambda: self.force_exit)
        await super().shutdown(sockets)
        lifespan = getattr(self.lifespan, "shutdown_event", None)
        if self.force_exit and lifespan is not None and not lifespan.is_set():
            await self.lifespan.shutdown()  # uvicorn skips the app's shutdown when forced: stop the engine


async def drain(state, timeout_s: float, hurry=lambda: False) -> None:
    """Wait for in-flight requests up to timeout_s (or until `hurry()`); abort the rest and wait for
    their answers."""
    state.draining = True
    if await _until_idle(state, timeout_s, hurry):
        return
    if hurry():
        reason = "the server is shutting down at once (a second stop signal)"
    else:
        reason = f"the server is shutting down (serve.drain_timeout_s={timeout_s:g}s ran out)"
        log.warning("drain: %d sequences still running after serve.drain_timeout_s=%gs; aborting them (503)",
                    state.inflight, timeout_s)
    state.worker.abort_all(reason)
    await _until_idle(state, ANSWER_S)


async def _until_idle(state, timeout_s: float, hurry=lambda: False) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while state.inflight and loop.time() < deadline and not hurry():
        await asyncio.sleep(0.02)
    return not state.inflight
