"""Serving over R ranks, the part every rank runs: one lock-step of the serving loop.

Rank 0 hosts the HTTP API and decides; every rank (rank 0 included) owns an Engine over its share
of the requests. Requests go to the mesh's DP groups (engine/mesh.py; one rank each without tensor
parallelism): the G ranks of a group get the same mail, hold the same sequences under the same ids
and step in lockstep, and the group's TP rank 0 alone reports its outputs and load. One serving
lock-step, on every rank, in the same order:

    exchange  one all_gather of a Payload per rank: rank 0's carries this lock-step's mail for every
              DP group (new sequences, aborts, calls; stop), every rank's its report of the previous
              lock-step (outputs by request, state, results of calls)
    plan      from the same payloads every rank concludes alike whether to step: some rank reported
              unfinished work, or the mail brings new sequences
    take      apply this rank's mail to its engine (between two steps, as the one-rank worker does),
              then DPGenerator.lockstep() (the engine's step, or the empty forward: every rank enters
              every MoE layer's all-to-all); the report goes out with the next exchange

One collective exchange per lock-step (two all_gathers: sizes, then the pickled bytes) instead of a
scatter and a gather of objects: 0.9 vs 2.4 ms per lock-step at R = 2 on the loaded development
machine. Rank 0 routes its own report at once and the others' one exchange later, which is when
they would arrive anyway (the next exchange follows the step at once while any rank has work).
The collectives run on a gloo group of their own (`control_group`), so they work beside NCCL on GPU. Requests carry rank 0's global ids (`gid`); each rank maps them to its engine's ids.
Nothing here knows how a rank holds the model: a rank is whatever `build_rank` made it, and the
front end (serve/rank_worker.py) sees only ranks that own requests.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
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
    rank: int  # global
    dp_rank: int = 0  # its DP group: the requests it serves
    tp_rank: int = 0  # its place in the group; rank 0 reports for the group (outputs, snapshot, load)
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
        self.dp_rank, self.dp_size, self.tp_rank = dp.dp_rank, dp.dp_size, dp.tp_rank  # (d, t) in the mesh
        self.profiler = None  # a RankProfiler while /v1/expert_distribution records (serve/rank_recording.py)
        self._comm_base = (0.0, 0.0, 0)  # the dispatcher's totals before its last reset (a recording's start)
        self._rids: dict[int, int] = {}  # gid → engine request id
        self._gids: dict[int, int] = {}  # engine request id → gid

    @property
    def engine(self):
        return self.dp.engine

    def take(self, mail: Mail, step: bool) -> Report:
        """Apply the mail, take the lock-step if `step` (every rank agreed, `plan`); this rank's report
        (outputs and load only from a DP group's TP rank 0: the group's other ranks compute the same)."""
        report, lead = Report(self.rank, self.dp_rank, self.tp_rank), self.tp_rank == 0
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
        if step:
            self.window.begin_step()
            for out in self.dp.lockstep():
                gid = self._gids.get(out.request_id)
                if gid is None:
                    continue
                if lead:
                    report.outputs.append((gid, out))
                if out.finish_reason is not None:
                    del self._gids[out.request_id], self._rids[gid]
        if mail.stop:
            self.abort_all()
        report.snapshot = self.snapshot()
        if lead and (not step or self.dp.steps % LOAD_EVERY == 0):
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


@dataclass
class Payload:
    """What one rank puts into an exchange."""

    report: Report | None = None  # of its previous lock-step (None before the first)
    mails: list[Mail] | None = None  # rank 0: this lock-step's mail for each rank


def exchange(side: RankSide, payload: Payload) -> list[Payload]:
    """Every rank's payload, on every rank (all_gather of the pickled bytes, padded to the longest)."""
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(side.world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=side.group)
    longest = max(int(n) for n in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)  # [bytes]
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    got = [torch.empty(longest, dtype=torch.uint8) for _ in range(side.world)]
    dist.all_gather(got, mine, group=side.group)
    return [pickle.loads(t[: int(n)].numpy().tobytes()) for t, n in zip(got, sizes)]


def plan(payloads: list[Payload], dp_rank: int) -> tuple[Mail, bool]:
    """The mail of this rank's DP group (every rank of the group gets the same), and whether every
    rank steps: the same answer on every rank."""
    mails = payloads[0].mails
    step = any(m.adds for m in mails) or any(p.report is not None and p.report.snapshot.unfinished
                                             for p in payloads)
    return mails[dp_rank], step


def follow(side: RankSide) -> None:
    """The loop of a rank > 0: take lock-steps as rank 0 mails them until it says stop. Signals that
    would end the process (Ctrl-C reaches the whole process group; torchrun forwards SIGTERM) are
    ignored: rank 0 drains and then stops every rank."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    report = None
    while True:
        mail, step = plan(exchange(side, Payload(report)), side.dp_rank)
        report = side.take(mail, step)
        if mail.stop:
            return
