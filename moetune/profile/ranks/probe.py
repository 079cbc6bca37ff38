"""RankProfiler: the Profiler of one expert-parallel rank, recording every lock-step, idle ones too.

Attached to a `DPGenerator` it is both the engine's StepObserver (the rank's own step, when it has
one) and the DPGenerator's LockStepObserver (around the step or the idle forward). Per lock-step it
keeps a `LockStep`: the rank's step kind (or "idle"), its phase and layer seconds, routing, copies
per physical slot, and per MoE layer the dispatcher's wait / transfer seconds and bytes sent.
Rank 0 gathers every rank's `RankRecord` and merges them (rank_merge.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from moetune.profile.probe import Profiler, attention_pairs
from moetune.profile.trace import id_dtype


@dataclass
class LockStep:
    step: int  # measured lock-step index (the same on every rank)
    kind: str  # prefill | decode | mixed | idle (this rank ran the empty forward)
    batch: int
    tokens: int  # T on this rank
    context_tokens: int
    attn_pairs: int
    seconds: float  # this rank's forward (its step, or the idle forward), less profiler bookkeeping
    phases: dict  # (layer, phase) → seconds
    layers: dict  # layer → seconds (measured decoder layers; none when idle)
    ids: np.ndarray  # [T, Lm, K] logical experts chosen by this rank's tokens
    counts: np.ndarray  # [Lm, P] copies this rank sent to each physical slot (all ranks' slots)
    block_m: list[int]  # [Lm] the experts kernel's row block
    io: np.ndarray  # [Lm, 4] wait seconds, transfer seconds, dispatch bytes, combine bytes
    tp_bytes: dict = field(default_factory=dict)  # (layer, phase) → [bytes, calls] of this rank's TP collectives


@dataclass
class RankRecord:
    rank: int
    row_bytes: int  # bytes of one dispatched row on the wire (D · wire dtype bytes)
    counters: dict  # the dispatcher's own totals over the measured lock-steps
    lock_steps: list[LockStep] = field(default_factory=list)
    coords: tuple[int, int] = (0, 0)  # (DP group, TP rank) in the mesh (engine/mesh.py); (rank, 0) without TP
    speculative: dict | None = None  # this rank's speculative counters over the measured steps (None: off)


class RankProfiler(Profiler):
    def __init__(self, model, dispatcher, rank: int, annotate: bool = False, on_step=None):
        super().__init__(model, annotate, on_step)
        self.dispatcher = dispatcher  # AllToAllDispatcher: wait_s, transfer_s, bytes_sent, calls
        self.rank = rank
        self.lock_steps: list[LockStep] = []
        self._kind: str | None = None
        self._batch = None
        self._seconds = 0.0
        self._io: dict[int, tuple[float, float, int, int]] = {}
        self._mark = (0.0, 0.0)
        self.speculative: dict | None = None  # set by the rank job after the measured steps

    def attach(self, dp) -> None:  # dp: DPGenerator
        super().attach(dp.engine)
        dp.observer = self

    def detach(self, dp) -> None:
        dp.observer = None
        super().detach(dp.engine)

    def start_measuring(self) -> None:
        """From here on every lock-step is kept and the dispatcher's counters start from zero."""
        self.recording = True
        self.dispatcher.reset_stats()

    def record(self, row_bytes: int) -> RankRecord:
        d = self.dispatcher
        counters = {"bytes_sent": d.bytes_sent, "wait_s": d.wait_s, "transfer_s": d.transfer_s, "calls": d.calls}
        return RankRecord(self.rank, row_bytes, counters, self.lock_steps)

    # LockStepObserver ------------------------------------------------------------------------
    def lockstep_begin(self) -> None:
        self.timer.reset()
        self._step_ids, self._step_moe, self._io = {}, {}, {}
        self._kind, self._batch = None, None
        self._mark = (self.dispatcher.wait_s, self.dispatcher.transfer_s)
        if self.model.tp is not None:
            self.model.tp.take()  # bytes of earlier calls (warm-up, logits checks) are not this lock-step's
        self.timer.sync()
        self._start = time.perf_counter()

    def lockstep_end(self, idle: bool) -> None:
        if idle:
            self.timer.sync()
            self._seconds = time.perf_counter() - self._start
            self._kind, self._batch = "idle", None
        if self.recording:
            self.lock_steps.append(self._lock_step())
        if self.on_step is not None:
            self.on_step(self._kind)

    # StepObserver (the rank's own step inside the lock-step) -----------------------------------
    def step_begin(self, kind: str, batch) -> None:
        self._kind, self._batch = kind, batch
        self.start_clock(kind)

    def step_end(self, kind: str, batch) -> None:
        self.timer.sync()
        self._seconds = time.perf_counter() - self._start
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    # Probe -----------------------------------------------------------------------------------
    def routed(self, layer: int, route, permute, block_m: int) -> None:
        if not self.recording:
            return
        start = time.perf_counter()
        self._step_ids[layer] = route.topk_ids.to("cpu").numpy().astype(id_dtype(self.num_experts))  # [T, K]
        self._step_moe[layer] = (permute.counts.to("cpu").numpy().astype(np.int64), block_m)  # [P], BLOCK_M
        self.timer.bookkeeping[layer] += time.perf_counter() - start

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        wait, transfer = self.dispatcher.wait_s, self.dispatcher.transfer_s
        self._io[layer] = (wait - self._mark[0], transfer - self._mark[1], dispatch_bytes, combine_bytes)
        self._mark = (wait, transfer)

    def _lock_step(self) -> LockStep:
        b, layers = self._batch, self.moe_layers
        K = self.model.spec.moe.router.top_k
        seconds = self._seconds - sum(self.timer.bookkeeping.values())
        ids = (np.stack([self._step_ids[i] for i in layers], axis=1) if layers
               else np.zeros((0, 0, K), id_dtype(self.num_experts)))  # [T, Lm, K]
        return LockStep(
            step=len(self.lock_steps), kind=self._kind or "idle",
            batch=0 if b is None else b.num_seqs, tokens=int(ids.shape[0]),
            context_tokens=0 if b is None else int(sum(b.context_lens)),
            attn_pairs=0 if b is None else attention_pairs(b.query_lens, b.context_lens),
            seconds=seconds, phases=dict(self.timer.phases), layers=self.timer.layer_seconds(),
            ids=ids, counts=np.stack([self._step_moe[i][0] for i in layers]),
            block_m=[int(self._step_moe[i][1]) for i in layers],
            io=np.array([self._io[i] for i in layers], dtype=np.float64),
            tp_bytes=self.model.tp.take() if self.model.tp is not None else {},
        )
