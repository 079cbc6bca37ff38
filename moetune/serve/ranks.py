"""Serving over R ranks, the part every rank runs: one lock-step of the serving loop.

Rank 0 hosts the HTTP API and decides; every rank (rank 0 included) owns an Engine over its share
of the requests. One serving lock-step, on every rank, in the same order:

    mail   = scatter_object_list from rank 0   (this rank's new requests, aborts, calls; stop; step?)
    apply the mail to this rank's engine       (between two steps, as the one-rank worker does)
    if mail.step: DPGenerator.lockstep()       (the engine's step, or the empty forward: every rank
                                                enters every MoE layer's all-to-all)
    report = gather_object to rank 0           (outputs by request, state, results of calls)

The object collectives run on a gloo group of their own (`control_group`), so they work beside
NCCL on GPU. Requests carry rank 0's global ids (`gid`); each rank maps them to its engine's ids.
Nothing here knows how a rank holds the model: a rank is whatever `build_rank` made it, and the
front end (serve/rank_worker.py) sees only ranks that own requests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.distributed as dist

from moetune.engine.engine import RequestOutput
from moetune.engine.sampling import SamplingParams
from moetune.errors import RequestError
from moetune.profile.ranks.run import dispatcher_of
from moetune.serve.worker import WorkerSnapshot

log = logging.getLogger("moetune.serve")
LOAD_EVERY = 16  # lock-steps between two reports of a rank's expert-load window (and on every idle tick)


@dataclass
class Add:
    gid: int
    prompt: list[int]
    params: SamplingParams
    priority: int = 0


@dataclass
class Mail:
    """What rank 0 tells one rank before a lock-step."""

    adds: list[Add] = field(default_factory=list)
    aborts: list[int] = field(default_factory=list)  # gids
    calls: list[tuple[int, Callable]] = field(default_factory=list)  # (call id, fn(RankSide) → picklable)
    step: bool = False  # take a lock-step (some rank has work)
    stop: bool = False  # abort everything and leave the loop


@dataclass
class RankSnapshot(WorkerSnapshot):
    """One rank's state after a lock-step, as rank 0's /metrics shows it."""

    unfinished: bool = False
    work_tokens: int = 0  # tokens of its running and waiting sequences (prompt + generated): its load
    lock_steps: int = 0
    idle_steps: int = 0  # lock-steps it ran the empty forward
    wait_s: float = 0.0  # in the all-to-alls: waiting for the slowest rank (cumulative)
    transfer_s: float = 0.0  # moving rows (dispatch + combine, cumulative)
    bytes_sent: int = 0  # rows that left this rank (cumulative)


@dataclass
class Report:
    rank: int
    outputs: list[tuple[int, RequestOutput]] = field(default_factory=list)  # (gid, output)
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (gid, why) for adds the engine refused
    calls: list[tuple[int, bool, Any]] = field(default_factory=list)  # (call id, ok, value or error text)
    snapshot: RankSnapshot = field(default_factory=RankSnapshot)
    load: Any = None  # [Lm, E] copies per expert over this rank's window, every LOAD_EVERY lock-steps


class RankSide:
    """One rank's engine as the serving loop drives it (on every rank, rank 0 included)."""

    def __init__(self, dp, window, group):
        self.dp, self.window, self.group = dp, window, group  # DPGenerator, ExpertLoadWindow, gloo group
        self.rank, self.world = dp.rank, dp.world
        self.profiler = None  # a RankProfiler while /v1/expert_distribution records (serve/rank_recording.py)
        self._comm_base = (0.0, 0.0, 0)  # the dispatcher's totals before its last reset (a recording's start)
        self._rids: dict[int, int] = {}  # gid → engine request id
        self._gids: dict[int, int] = {}  # engine request id → gid

    @property
    def engine(self):
        return self.dp.engine

    def take(self, mail: Mail) -> Report:
        """Apply the mail, take the lock-step it asks for; this rank's report."""
        report = Report(self.rank)
        for gid in mail.aborts:
            rid = self._rids.pop(gid, None)
            if rid is not None:
                self._gids.pop(rid, None)
                self.engine.abort(rid)
        for add in mail.adds:
            try:
                rid = self.engine.add_request(add.prompt, add.params, priority=add.priority)
            except RequestError as exc:
                report.rejected.append((add.gid, str(exc)))
                continue
            self._rids[add.gid], self._gids[rid] = rid, add.gid
        for call_id, fn in mail.calls:
            try:
                report.calls.append((call_id, True, fn(self)))
            except Exception as exc:  # handed to the caller on rank 0
                report.calls.append((call_id, False, f"rank {self.rank}: {type(exc).__name__}: {exc}"))
        if mail.step:
            self.window.begin_step()
            for out in self.dp.lockstep():
                gid = self._gids.get(out.request_id)
                if gid is None:
                    continue
                report.outputs.append((gid, out))
                if out.finish_reason is not None:
                    del self._gids[out.request_id], self._rids[gid]
        if mail.stop:
            self.abort_all()
        report.snapshot = self.snapshot()
        if not mail.step or self.dp.steps % LOAD_EVERY == 0:
            report.load = self.window.counts()
        return report

    def abort_all(self) -> None:
        for rid in list(self._gids):
            self.engine.abort(rid)
        self._gids.clear()
        self._rids.clear()

    def snapshot(self) -> RankSnapshot:
        e, dp = self.engine, self.dp
        seqs = list(e.scheduler.waiting) + list(e.scheduler.running)
        disp = dispatcher_of(dp.model)
        return RankSnapshot(
            waiting=len(e.scheduler.waiting), running=len(e.scheduler.running),
            kv_blocks_used=e.blocks.num_blocks - e.blocks.num_free, kv_blocks_total=e.blocks.num_blocks,
            steps=sum(e.stats.steps.values()), preemptions=e.stats.preemptions,
            prefix_cache_hit_tokens=e.stats.prefix_cache_hit_tokens, computed_tokens=e.stats.computed_tokens,
            unfinished=e.has_unfinished(), work_tokens=sum(s.num_tokens for s in seqs),
            lock_steps=dp.steps, idle_steps=dp.idle_steps,
            wait_s=self._comm_base[0] + disp.wait_s, transfer_s=self._comm_base[1] + disp.transfer_s,
            bytes_sent=self._comm_base[2] + disp.bytes_sent)

    def bank_comm(self) -> None:
        """Keep the dispatcher's totals before something resets them (the metrics count on)."""
        d, (w, t, b) = dispatcher_of(self.dp.model), self._comm_base
        self._comm_base = (w + d.wait_s, t + d.transfer_s, b + d.bytes_sent)


def control_group():
    """A gloo group over every rank for the serving loop's object collectives (collective: every
    rank calls it once, in the same order)."""
    return dist.new_group(backend="gloo")


def exchange(side: RankSide, mails: list[Mail] | None) -> tuple[list[Report] | None, bool]:
    """One serving lock-step on this rank: mails (one per rank) on rank 0, None elsewhere.
    → (every rank's report on rank 0, None elsewhere; whether rank 0 said stop)."""
    box: list = [None]
    dist.scatter_object_list(box, mails if side.rank == 0 else None, src=0, group=side.group)
    mail: Mail = box[0]
    report = side.take(mail)
    reports: list | None = [None] * side.world if side.rank == 0 else None
    dist.gather_object(report, reports, dst=0, group=side.group)
    return reports, mail.stop


def follow(side: RankSide) -> None:
    """The loop of a rank > 0: take lock-steps as rank 0 mails them until it says stop. Signals that
    would end the process (Ctrl-C reaches the whole process group; torchrun forwards SIGTERM) are
    ignored: rank 0 drains and then stops every rank."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while not exchange(side, None)[1]:
        pass
