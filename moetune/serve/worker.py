"""EngineWorker: the one thread that owns the Engine; asyncio handlers talk to it through commands.
(`CommandWorker` is what it shares with rank 0's RanksWorker over R ranks: the command queue, the
thread, its health, and answering commands at once after the thread failed.)

The engine is not thread-safe, so every call on it (add, abort, step, attaching a profiler) runs
on this thread, between two steps. Handlers submit a `Stream` (one HTTP request, n sequences) and
read events from its asyncio queue; outputs are handed over once per step per stream with
`loop.call_soon_threadsafe`. With nothing to run, the thread sleeps on an event.

A request's sequences are checked when it arrives and reach the engine through the `SlotGate`
(serve/fairness.py): at most a stated share of the running slots per request and per tenant at
once, the rest as its earlier sequences finish.

Events a stream receives, in order: ("admitted", None), ("error", RequestError) (a request the
engine can never run: 400) or ("failed", reason) first, then ("out", [(choice, RequestOutput, step
time), ...]) once per step, or once per `stream_interval` steps (serve/stream_interval.py), and
("aborted", reason) if the server stops, or ("failed", reason) if the engine fails under it.

The thread never dies from a request. Whatever escapes a step (or an add) is logged once with the
request ids, the affected streams get ("failed", ...), and the engine is reset and checked
(`Engine.reset`, `Engine.self_check`). If that fails too, the worker is dead: `failure` says why,
every stream (queued, running, submitted later) gets ("failed", ...), `/health` answers 503, and
`on_fatal(reason)` (set by `moetune serve`) makes the process exit non-zero for a supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from moetune.engine.engine import Engine
from moetune.engine.sampling import SamplingParams
from moetune.errors import RequestError
from moetune.serve.fairness import SlotGate
from moetune.serve.stream_interval import StreamHold

log = logging.getLogger("moetune.serve")


@dataclass
class Stream:
    """One HTTP request: its sequences' prompts and params, and the queue its events arrive on."""

    prompts: list[list[int]]  # per choice
    params: list[SamplingParams]  # per choice
    loop: asyncio.AbstractEventLoop
    priority: int = 0
    tenant: str = ""
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    rids: list[int] = field(default_factory=list)  # engine request ids, set on the engine thread
    arrival: float = field(default_factory=time.monotonic)
    started: bool = False  # its first tokens were handed over (engine thread; serve/stream_interval.py)

    def post(self, *event) -> None:
        """From the engine thread: put an event on the queue (on the loop's thread)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def post_outputs(by_stream: dict[int, tuple[Stream, list]]) -> None:
    """From the engine thread: an ("out", [(choice, RequestOutput, step time), ...]) event to each
    stream, in one hand-over per event loop. `call_soon_threadsafe` per stream wrote the loop's wake-up pipe and queued a
    callback once per running request and step (64 at max_num_seqs 64), work that the front end's
    thread then did under the GIL the engine's thread needs between its kernels."""
    per_loop: dict[int, tuple[asyncio.AbstractEventLoop, list]] = {}
    for stream, items in by_stream.values():
        per_loop.setdefault(id(stream.loop), (stream.loop, []))[1].append((stream.queue, ("out", items)))
    for loop, events in per_loop.values():
        try:
            loop.call_soon_threadsafe(_deliver, events)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def _deliver(events: list[tuple[asyncio.Queue, tuple]]) -> None:
    """On the loop's thread: each event onto its stream's queue."""
    for queue, event in events:
        queue.put_nowait(event)


@dataclass
class WorkerSnapshot:
    """Engine state after the latest step, read by /metrics from other threads (plain ints)."""

    waiting: int = 0
    running: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    steps: int = 0
    preemptions: int = 0
    prefix_cache_hit_tokens: int = 0
    computed_tokens: int = 0
    healthy: int = 1  # 0 once the engine failed and could not be reset
    resets: int = 0  # times the engine was reset after a failed step
    # speculative decoding (engine.speculative), since start: verify steps, draft tokens verified and
    # accepted, Σ over verify steps × MoE layers of the distinct experts woken / a plain decode's
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verified: int = 0
    experts_verify: int = 0
    experts_plain: int = 0
    expert_layers: int = 0
    experts_draft: int = 0  # Σ over the drafter's MoE forwards (an MTP block) of the distinct experts read


class CommandWorker:
    """What both drivers of the engine share (this EngineWorker, and rank 0's RanksWorker over R
    ranks, serve/rank_worker.py): the handlers' commands queued for one thread that runs `_run`,
    the thread's health, and the answer a command gets once that thread has failed (`failure`)."""

    thread_name = "moetune-engine"
    stop_timeout_s = 10.0
    late_event = "failed"  # what a stream submitted after the failure receives

    def __init__(self, gate: SlotGate | None = None):
        self.gate = gate or SlotGate()  # which checked sequences may go to the engine(s) now
        self.failure: str | None = None  # set once, when the engine (or a rank) is dead
        self.on_fatal: Callable[[str], None] | None = None  # called on the worker's thread with `failure`
        self._cmds: deque = deque()
        self._lock = threading.Lock()  # orders _send against the thread's death
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._hosted = False  # the loop runs on a caller's thread (`host`), not on self._thread
        self._done = threading.Event()  # a hosted loop returned

    def host(self) -> None:
        """The calling thread will run the loop (`run_hosted`) instead of a thread of the worker's own;
        `start()` is then a no-op and `stop()` waits for that loop. For `moetune serve`, whose main
        thread built the model: the CPU kernels' OpenMP teams belong to the thread that launches them,
        and a second launching thread makes both teams slow (serve/engine_on_main.py)."""
        self._thread = threading.current_thread()
        self._hosted = True

    def run_hosted(self) -> None:
        """The loop on the thread that called `host()`, until `stop()` or the engine's failure."""
        try:
            self._run()
        finally:
            self._done.set()

    # called from any thread -------------------------------------------------------------------
    def start(self) -> None:
        if not self._hosted:
            self._thread.start()

    @property
    def healthy(self) -> bool:
        """Requests are taken: not failed, and the thread alive once started."""
        if self._hosted:
            return self.failure is None and not self._done.is_set()
        return self.failure is None and (self._thread.is_alive() or self._thread.ident is None)

    def submit(self, stream: Stream) -> None:
        self._send(("add", stream))

    def abort(self, stream: Stream) -> None:
        self._send(("abort", stream))

    def abort_all(self, reason: str) -> None:
        """Abort every request the engine(s) hold; their streams get ("aborted", reason) (the drain's deadline)."""
        self._send(("abort_all", reason))

    def call(self, fn: Callable[[Engine], object]) -> Future:
        """Run fn(engine) on the worker's thread between two steps; its result as a Future."""
        fut: Future = Future()
        self._send(("call", fn, fut))
        return fut

    def stop(self, timeout: float | None = None) -> None:
        """Abort whatever still runs, then end the thread."""
        self._send(("stop",))
        timeout = self.stop_timeout_s if timeout is None else timeout
        if self._hosted:
            self._done.wait(timeout)
        else:
            self._thread.join(timeout)

    def _send(self, cmd: tuple) -> None:
        with self._lock:
            if self.failure is None:
                self._cmds.append(cmd)
                self._wake.set()
                return
        _refuse(cmd, self.failure, self.late_event)  # the thread is gone: answer here

    def _fail(self, reason: str) -> None:
        """On the worker's thread: no command is queued from now on; those queued are answered."""
        with self._lock:
            self.failure = reason
        while self._cmds:
            _refuse(self._cmds.popleft(), reason, self.late_event)

    def _run(self) -> None:
        raise NotImplementedError


class EngineWorker(CommandWorker):
    def __init__(self, engine: Engine, before_step: Callable[[], None] | None = None,
                 after_step: Callable[[], None] | None = None, qos=None, gate: SlotGate | None = None,
                 stream_interval: int = 1):
        super().__init__(gate)
        self.engine = engine
        self.hold = StreamHold(stream_interval)  # tokens handed to the front end every `stream_interval` steps
        self.before_step = before_step  # e.g. the live expert-load window advancing
        self.after_step = after_step  # e.g. the QoS policy reading the step's routing
        self.qos = qos  # moetune.serve.qos.ExpertQoS (the scheduler's policy) or None
        if qos is not None:
            engine.scheduler.policy = qos
        self.snapshot = WorkerSnapshot(kv_blocks_total=engine.blocks.num_blocks)
        self._routes: dict[int, tuple[Stream, int]] = {}  # rid → (stream, choice index); engine thread only

    # the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping and self.failure is None:
                try:
                    self._turn()
                except Exception as exc:
                    self._recover(exc)
            if self.failure is None:
                self._abort_all("server shutting down")
        except BaseException as exc:  # not even recovery worked
            self._die(f"the engine thread failed: {type(exc).__name__}: {exc}")

    def _turn(self) -> None:
        self._wake.clear()
        self._drain()
        if self._stopping:
            return
        if not self.engine.has_unfinished():
            self._wake.wait(1.0)
            return
        self._step()

    def _recover(self, exc: Exception) -> None:
        """Something escaped a step or a command: fail what the engine holds, reset it, check it."""
        rids = sorted(self._routes)
        log.error("engine step failed (requests %s): %s: %s; failing them and resetting the engine", rids,
                  type(exc).__name__, exc, exc_info=exc)
        self._fail_all(f"internal error in the engine step ({type(exc).__name__}); the engine was reset")
        try:
            self.engine.reset()
            self.engine.self_check()
        except Exception as again:
            self._die(f"the engine could not be reset after a failed step: {type(again).__name__}: {again}")
            return
        self.snapshot.resets += 1
        self._refresh()

    def _die(self, reason: str) -> None:
        log.error("%s; the server is unhealthy and stops", reason)
        self.snapshot.healthy = 0
        streams = self._streams()
        self._routes.clear()
        self.gate.clear()
        self.hold.clear()
        for stream in streams:
            stream.post("failed", reason)
        self._fail(reason)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def _drain(self) -> None:
        while self._cmds:
            cmd = self._cmds.popleft()
            if cmd[0] == "add":
                self._add(cmd[1])
            elif cmd[0] == "abort":
                self._drop(cmd[1])
            elif cmd[0] == "call":
                _, fn, fut = cmd
                try:
                    fut.set_result(fn(self.engine))
                except Exception as exc:  # handed to the caller, who decides
                    fut.set_exception(exc)
            elif cmd[0] == "abort_all":
                self._abort_all(cmd[1])
            elif cmd[0] == "stop":
                self._stopping = True
        if not self._stopping:
            self._feed()
        self._refresh()

    def _add(self, stream: Stream) -> None:
        """Check every sequence of the request (a RequestError: 400), then queue it at the gate."""
        try:
            for prompt, params in zip(stream.prompts, stream.params):
                self.engine.check_request(prompt, params)
        except Exception as exc:  # RequestError: the caller's mistake (400); anything else: ours
            if isinstance(exc, RequestError):
                stream.post("error", exc)
            else:
                log.error("checking a request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
                stream.post("failed", f"internal error admitting the request ({type(exc).__name__})")
            return
        self.gate.offer(stream)
        stream.post("admitted", None)

    def _feed(self) -> None:
        """Hand the engine the sequences the gate lets through."""
        broken: set[int] = set()
        for stream, i in self.gate.take():
            if id(stream) in broken:
                continue
            try:
                rid = self.engine.add_request(stream.prompts[i], stream.params[i], priority=stream.priority)
            except Exception as exc:  # checked on arrival: not the caller's mistake
                log.error("adding request %s failed: %s: %s", stream.rids, type(exc).__name__, exc, exc_info=exc)
                broken.add(id(stream))
                self._drop(stream)
                stream.post("failed", f"internal error admitting the request ({type(exc).__name__})")
                continue
            stream.rids.append(rid)
            self._routes[rid] = (stream, i)
            if self.qos is not None:
                self.qos.track(rid, stream.tenant)

    def _drop(self, stream: Stream) -> None:
        """Abort the stream's sequences in the engine and let go of those still at the gate."""
        for rid in stream.rids:
            if self._routes.pop(rid, None) is not None:
                self.engine.abort(rid)
                self._forget(rid)
        self.gate.forget(stream)
        self.hold.drop(stream)

    def _streams(self) -> list[Stream]:
        """Every stream with sequences in the engine or at the gate."""
        streams = {id(s): s for s, _ in self._routes.values()}
        streams.update((id(s), s) for s in self.gate.streams())
        return list(streams.values())

    def _step(self) -> None:
        if self.before_step is not None:
            self.before_step()
        outs = self.engine.step()  # what escapes: _recover
        if self.after_step is not None:
            self.after_step()
        now = time.monotonic()
        by_stream: dict[int, tuple[Stream, list]] = {}
        for out in outs:
            route = self._routes.get(out.request_id)
            if route is None:
                continue
            stream, index = route
            by_stream.setdefault(id(stream), (stream, []))[1].append((index, out, now))
            if out.finish_reason is not None:
                del self._routes[out.request_id]
                self._forget(out.request_id)
                self.gate.finished(stream)
        post_outputs(self.hold.due(by_stream))
        self._refresh()

    def _abort_all(self, reason: str) -> None:
        streams = self._streams()
        for rid in list(self._routes):
            self.engine.abort(rid)
            self._forget(rid)
        self._routes.clear()
        self.gate.clear()
        self.hold.clear()
        for stream in streams:
            stream.post("aborted", reason)
        self._refresh()

    def _fail_all(self, reason: str) -> None:
        """After a failed step: tell every stream, whatever state the engine is in (reset follows)."""
        streams = self._streams()
        for rid in self._routes:
            self._forget(rid)
        self._routes.clear()
        self.gate.clear()
        self.hold.clear()
        for stream in streams:
            stream.post("failed", reason)

    def _forget(self, rid: int) -> None:
        if self.qos is not None:
            self.qos.forget(rid)

    def _refresh(self) -> None:
        e, snap = self.engine, self.snapshot
        snap.waiting = len(e.scheduler.waiting) + self.gate.pending  # the gate's wait too
        snap.running = len(e.scheduler.running)
        snap.kv_blocks_used = e.blocks.num_blocks - e.blocks.num_free
        snap.steps = sum(e.stats.steps.values())
        snap.preemptions = e.stats.preemptions
        snap.prefix_cache_hit_tokens = e.stats.prefix_cache_hit_tokens
        snap.computed_tokens = e.stats.computed_tokens
        st, ex = e.stats, e.runner.experts
        snap.verify_steps, snap.draft_tokens, snap.accepted_tokens = st.verify_steps, st.draft_tokens, st.accepted_tokens
        snap.verified = st.verified
        if ex is not None:
            snap.experts_verify, snap.experts_plain, snap.expert_layers = ex.verify, ex.plain, ex.layers
            snap.experts_draft = ex.draft


def _refuse(cmd: tuple, reason: str, event: str = "failed") -> None:
    """A command that reaches a dead worker: answered at once, so that nobody waits for it (a new
    stream gets (event, reason); a call's future the error)."""
    if cmd[0] == "add":
        cmd[1].post(event, reason)
    elif cmd[0] in ("call", "call_all"):
        cmd[2].set_exception(RuntimeError(reason))
