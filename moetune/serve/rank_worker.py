"""RanksWorker: on rank 0, the thread that drives every rank's engine (serve/ranks.py) for the HTTP
handlers; the same face as the one-rank EngineWorker (submit, abort, call, stop, snapshot).

Between two lock-steps it turns the handlers' commands into each rank's mail: a new request's
sequences are checked against rank 0's engine (every rank's is built from the same config, so a
bad request is refused before any rank sees it) and, as the `SlotGate` lets it through (a share of
the running slots per request and per tenant, serve/fairness.py), each goes to the rank with the least work —
the tokens of its running and waiting sequences, as last reported, plus what was assigned since;
an abort goes to the rank that owns the sequence. The reports that come back are routed to the
streams as the one-rank worker routes its engine's outputs, and the ranks' state is kept for
/metrics. With nothing to run it still exchanges an empty mail every IDLE_TICK_S, so the other
ranks' collectives never wait past their timeout.

If a collective fails (a rank died), the worker fails every stream with an error naming no rank
yet (the launcher names it once every process is looked at), calls `on_failure` (the server stops
taking requests and shuts down) and keeps the exception for rank 0's main thread to raise.
"""

from __future__ import annotations

import itertools
import logging
import time
from concurrent.futures import Future
from typing import Callable

from moetune.errors import RequestError
from moetune.serve.fairness import SlotGate
from moetune.serve.ranks import Add, Mail, Payload, RankSide, RankSnapshot, Report, exchange, plan
from moetune.serve.worker import CommandWorker, Stream, WorkerSnapshot, post_outputs

log = logging.getLogger("moetune.serve")
IDLE_TICK_S = 1.0


class RanksWorker(CommandWorker):
    """Requests go to the R data-parallel groups of the mesh (`groups` = R: one rank each without
    tensor parallelism); every rank of a group gets the same mail and steps alike, and the group's
    TP rank 0 alone reports its outputs, state and load (serve/ranks.py)."""

    thread_name = "moetune-ranks"
    stop_timeout_s = 30.0
    late_event = "aborted"

    def __init__(self, side: RankSide, on_failure: Callable[[BaseException], None] | None = None,
                 gate: SlotGate | None = None):
        super().__init__(gate)
        self.side, self.world, self.groups = side, side.world, side.dp_size
        self.engine = side.engine  # rank 0's: checks requests (and `call` runs on it)
        self.on_failure = on_failure
        blocks = self.engine.blocks.num_blocks
        self.snapshot = WorkerSnapshot(kv_blocks_total=blocks * self.groups)  # all groups
        self.ranks = [RankSnapshot(kv_blocks_total=blocks) for _ in range(self.groups)]  # per DP group
        self.assigned = [0] * self.groups  # sequences sent to each DP group since start
        self.loads: list = [None] * self.groups  # [Lm, E] per DP group, the latest reported window
        self.error: BaseException | None = None  # the collective's error, for rank 0's main thread to raise
        self._pending = [0] * self.groups  # tokens assigned since the group last reported
        self._sent = [0] * self.groups  # of which in the latest mails
        self._gids = itertools.count()
        self._calls = itertools.count()
        self._routes: dict[int, tuple[Stream, int, int]] = {}  # gid → (stream, choice, DP group)
        self._waiting_calls: dict[int, tuple[Future, list]] = {}  # call id → (future, results by global rank)

    def call_all(self, fn: Callable) -> Future:
        """fn(RankSide) on every rank between two lock-steps (fn picklable); the results by global rank."""
        fut: Future = Future()
        self._send(("call_all", fn, fut))
        return fut

    # the loop ---------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            report, stopped = None, False
            while not stopped:
                if not self._busy() and not self._cmds:
                    self._wake.wait(IDLE_TICK_S)
                self._wake.clear()
                payloads = exchange(self.side, Payload(report, self._mails()))
                self._route([p.report for p in payloads[1:] if p.report is not None], fresh=False)
                mail, step = plan(payloads, 0)
                report = self.side.take(mail, step)
                self._route([report], fresh=True)
                stopped = mail.stop
        except Exception as exc:  # a collective failed: a rank is gone
            self.error = exc
            self.snapshot.healthy = 0
            self._fail_all("a serving rank failed; the server is stopping")
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        self._fail_all("server shutting down")

    def _busy(self) -> bool:
        """Another exchange now: some rank has (or was just sent) work, or owes a call's result."""
        return (any(r.unfinished for r in self.ranks) or any(self._sent) or bool(self._waiting_calls)
                or self.gate.pending > 0)

    def _mails(self) -> list[Mail]:
        """This lock-step's mail for each DP group."""
        mails = [Mail() for _ in range(self.groups)]
        self._sent = [0] * self.groups
        while self._cmds:
            cmd = self._cmds.popleft()
            if cmd[0] == "add":
                self._add(cmd[1], mails)
            elif cmd[0] == "abort":
                for gid in cmd[1].rids:
                    route = self._routes.pop(gid, None)
                    if route is not None:
                        mails[route[2]].aborts.append(gid)
                self.gate.forget(cmd[1])
            elif cmd[0] == "abort_all":
                for stream in self._streams():
                    self._abort_stream(stream, cmd[1])
            elif cmd[0] == "abort_gid":
                mails[cmd[2]].aborts.append(cmd[1])
            elif cmd[0] == "call":
                _, fn, fut = cmd
                try:
                    fut.set_result(fn(self.engine))
                except Exception as exc:  # handed to the caller
                    fut.set_exception(exc)
            elif cmd[0] == "call_all":
                call_id = next(self._calls)
                self._waiting_calls[call_id] = (cmd[2], [None] * self.world)
                for mail in mails:
                    mail.calls.append((call_id, cmd[1]))
            elif cmd[0] == "stop":
                for mail in mails:
                    mail.stop = True
        if not mails[0].stop:
            self._feed(mails)
        return mails

    def _add(self, stream: Stream, mails: list[Mail]) -> None:
        try:
            for prompt, params in zip(stream.prompts, stream.params):
                self.engine.check_request(prompt, params)
        except RequestError as exc:
            stream.post("error", exc)
            return
        self.gate.offer(stream)
        stream.post("admitted", None)

    def _feed(self, mails: list[Mail]) -> None:
        """The sequences the gate lets through, each to the DP group with the least work."""
        for stream, i in self.gate.take():
            prompt, params = stream.prompts[i], stream.params[i]
            gid, group = next(self._gids), self._least_work()
            stream.rids.append(gid)
            self._routes[gid] = (stream, i, group)
            self._pending[group] += len(prompt)
            self._sent[group] += len(prompt) or 1
            self.assigned[group] += 1
            mails[group].adds.append(Add(gid, prompt, params, stream.priority))

    def _streams(self) -> list[Stream]:
        """Every stream with sequences on a rank or at the gate."""
        streams = {id(r[0]): r[0] for r in self._routes.values()}
        streams.update((id(s), s) for s in self.gate.streams())
        return list(streams.values())

    def _least_work(self) -> int:
        work = [r.work_tokens + p for r, p in zip(self.ranks, self._pending)]
        return min(range(self.groups), key=lambda k: (work[k], k))

    def _route(self, reports: list[Report], fresh: bool) -> None:
        """fresh: reports of the lock-step just taken (rank 0's own), which include the latest mails'
        sequences; the others' are of the lock-step before, which do not."""
        now = time.monotonic()
        by_stream: dict[int, tuple[Stream, list]] = {}
        for report in reports:
            for call_id, ok, value in report.calls:
                fut, results = self._waiting_calls[call_id]
                results[report.rank] = (ok, value)
            if report.tp_rank != 0:  # the group's rank 0 speaks for it
                continue
            group = report.dp_rank
            self.ranks[group] = report.snapshot
            self._pending[group] = 0 if fresh else self._sent[group]
            if report.load is not None:
                self.loads[group] = report.load
            for gid, out in report.outputs:
                route = self._routes.get(gid)
                if route is None:
                    continue
                stream, index, _ = route
                by_stream.setdefault(id(stream), (stream, []))[1].append((index, out, now))
                if out.finish_reason is not None:
                    del self._routes[gid]
                    self.gate.finished(stream)
            for gid, why in report.rejected:  # not expected: every engine checks alike
                route = self._routes.pop(gid, None)
                if route is not None:
                    self._abort_stream(route[0], f"rank {report.rank} refused the request: {why}")
        post_outputs(by_stream)
        self._finish_calls()
        self._sum_snapshots()

    def _finish_calls(self) -> None:
        for call_id, (fut, results) in list(self._waiting_calls.items()):
            if any(r is None for r in results):
                continue
            del self._waiting_calls[call_id]
            failed = [value for ok, value in results if not ok]
            if failed:
                fut.set_exception(RuntimeError(failed[0]))
            else:
                fut.set_result([value for _, value in results])

    def _sum_snapshots(self) -> None:
        s = self.snapshot
        for name in ("waiting", "running", "kv_blocks_used", "steps", "preemptions", "prefix_cache_hit_tokens",
                     "computed_tokens"):
            setattr(s, name, sum(getattr(r, name) for r in self.ranks))
        s.waiting += self.gate.pending  # the gate's wait too

    def _abort_stream(self, stream: Stream, reason: str) -> None:
        """Fail a stream whose sequences may run on other ranks: they are aborted with the next mail."""
        for gid in stream.rids:
            route = self._routes.pop(gid, None)
            if route is not None:
                self._cmds.append(("abort_gid", gid, route[2]))
        self.gate.forget(stream)
        stream.post("aborted", reason)

    def _fail_all(self, reason: str) -> None:
        streams = self._streams()
        self._routes.clear()
        self.gate.clear()
        for stream in streams:
            stream.post("aborted", reason)
        for fut, _ in self._waiting_calls.values():
            fut.set_exception(RuntimeError(reason))
        self._waiting_calls.clear()
        self._fail(reason)  # streams and calls submitted after the last lock-step, and any later
