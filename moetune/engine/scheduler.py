"""Scheduler: which sequences compute how many tokens in the next step.

Each step has a token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`).
Running sequences go first, in priority then arrival order: a decode takes one token, a prompt
being prefilled in chunks takes what is left of the budget. Decodes with draft tokens (speculative
decoding) then get up to their draft's length of lookahead tokens from what is left of the budget
and the free blocks. Then waiting sequences are admitted (prefix-cache hits first count as
computed) while budget, sequence slots and KV blocks last; a prompt longer than the remaining
budget is split into chunks over several steps (chunked prefill), running beside the decodes of
other sequences. When a running sequence needs a KV block and none is free, the latest-arrived
running sequence is preempted: its blocks are freed and it waits to be recomputed from its tokens
(preemption by recompute); no new sequence is admitted in that step.

Which waiting request is admitted next is the `Admission` policy's choice: `FCFSAdmission` (the
queue head: priority, then arrival) or expert affinity (engine/affinity.py: the request whose
predicted experts the step already wakes, with a bounded extra wait). Running sequences are
scheduled alike under both.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from moetune.config import EngineConfig
from moetune.engine.block_manager import BlockManager
from moetune.engine.sequence import SeqStatus, Sequence
from moetune.model.batch import StepKind


@dataclass
class Scheduled:
    seq: Sequence
    num_tokens: int  # tokens computed this step (a verify step: the last token + num_draft drafted ones)
    num_draft: int = 0  # of which the sequence's draft tokens to verify (seq.draft_ids[:num_draft])

    @property
    def is_decode(self) -> bool:
        return not self.seq.in_prefill


@dataclass
class SchedulerOutput:
    entries: list[Scheduled]  # decodes first, then prefill chunks
    kind: StepKind
    preempted: list[Sequence]
    new_blocks: list[int]  # KV blocks handed out for this step (the runner zeroes them)

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries)


class StepPolicy(Protocol):
    """Told about each step's schedule and may hold a running sequence's decode back for a step
    (serve's per-tenant expert-capacity QoS plugs in here). It must let at least one decode through
    when any is asked for, or the engine would stop making progress."""

    def begin(self, running: list[Sequence]) -> None: ...

    def allow_decode(self, seq: Sequence) -> bool: ...

    def scheduled(self, out: "SchedulerOutput") -> None: ...


class Admission(Protocol):
    """Chooses the order in which waiting requests are admitted within a step."""

    def start(self, waiting: deque[Sequence], scheduled: list[Sequence]) -> None: ...

    def pick(self, waiting: deque[Sequence]) -> int: ...

    def admitted(self, seq: Sequence) -> None: ...

    def done(self) -> None: ...

    def forget(self, seq: Sequence) -> None: ...


class FCFSAdmission:
    """The queue head first (the queue is ordered by priority, then arrival)."""

    def start(self, waiting: deque[Sequence], scheduled: list[Sequence]) -> None:
        return None

    def pick(self, waiting: deque[Sequence]) -> int:
        return 0

    def admitted(self, seq: Sequence) -> None:
        return None

    def done(self) -> None:
        return None

    def forget(self, seq: Sequence) -> None:
        return None


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager, admission: Admission | None = None):
        self.config = config
        self.blocks = blocks
        self.admission: Admission = admission or FCFSAdmission()
        self.policy: StepPolicy | None = None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.cached_tokens = 0  # tokens admitted sequences found in the prefix cache

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        if seq.priority == 0 or not self.waiting:
            self.waiting.append(seq)
            return
        at = next((i for i, s in enumerate(self.waiting) if s.priority > seq.priority), len(self.waiting))
        self.waiting.insert(at, seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence from the queues and free its blocks."""
        if seq.status == SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SeqStatus.WAITING:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        self.admission.forget(seq)
        seq.status = SeqStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        entries, preempted = [], []
        if self.policy is not None:
            self.policy.begin(self.running)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status != SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            if self.policy is not None and not seq.in_prefill and not self.policy.allow_decode(seq):
                continue  # held back this step; keeps its blocks
            n = min(seq.num_remaining, budget)
            if self._make_room(seq, seq.num_computed_tokens + n, preempted):
                self.blocks.grow(seq, seq.num_computed_tokens + n)
                entries.append(Scheduled(seq, n))
                budget -= n
        budget = self._lookahead(entries, budget)
        self.admission.start(self.waiting, [e.seq for e in entries])
        if not preempted:
            budget = self._admit(entries, budget)
        self.admission.done()
        entries.sort(key=lambda e: (not e.is_decode, e.num_tokens != 1))  # stable: decodes, verifies, prefills
        new_blocks, self.blocks.granted = self.blocks.granted, []
        out = SchedulerOutput(entries, _kind(entries), preempted, new_blocks)
        if self.policy is not None:
            self.policy.scheduled(out)
        return out

    def _lookahead(self, entries: list[Scheduled], budget: int) -> int:
        """Extend decodes with their draft tokens (speculative decoding) while budget and free KV
        blocks last; after every running sequence got its token, before new ones are admitted. A
        draft never preempts: without room it is cut, or dropped."""
        for e in entries:
            seq = e.seq
            if budget == 0:
                break
            if seq.in_prefill or not seq.draft_ids:
                continue
            d = min(len(seq.draft_ids), budget)
            while d and not self.blocks.can_grow(seq, seq.num_computed_tokens + e.num_tokens + d):
                d -= 1
            if d:
                self.blocks.grow(seq, seq.num_computed_tokens + e.num_tokens + d)
                e.num_tokens, e.num_draft = e.num_tokens + d, d
                budget -= d
        return budget

    def _admit(self, entries: list[Scheduled], budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            at = self.admission.pick(self.waiting)
            seq = self.waiting[at]
            self.blocks.admit(seq)
            n = min(seq.num_remaining, budget)
            fits = self.config.chunked_prefill or n == seq.num_remaining
            if not fits or not self.blocks.can_grow(seq, seq.num_computed_tokens + n):
                self.blocks.free(seq)
                seq.num_computed_tokens = 0
                break
            self.blocks.grow(seq, seq.num_computed_tokens + n)
            del self.waiting[at]
            self.admission.admitted(seq)
            self.cached_tokens += seq.num_cached_tokens
            seq.status, seq.in_prefill = SeqStatus.RUNNING, True
            self.running.append(seq)
            entries.append(Scheduled(seq, n))
            budget -= n
        return budget

    def _make_room(self, seq: Sequence, num_tokens: int, preempted: list[Sequence]) -> bool:
        """Free blocks until `seq` can hold num_tokens by preempting the latest running sequences;
        False when `seq` itself had to go."""
        while not self.blocks.can_grow(seq, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed_tokens, seq.status, seq.in_prefill = 0, SeqStatus.WAITING, True
        self.waiting.appendleft(seq)
        self.num_preemptions += 1


def _kind(entries: list[Scheduled]) -> StepKind:
    decodes = sum(e.is_decode for e in entries)
    if decodes == len(entries):
        return StepKind.DECODE
    return StepKind.PREFILL if decodes == 0 else StepKind.MIXED
