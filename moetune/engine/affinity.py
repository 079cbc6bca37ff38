"""Expert-affinity admission: of the waiting requests, admit first those whose experts the step
already wakes, so that a step wakes fewer distinct experts (fewer weight reads and offload fetches,
more rows per expert GEMM) — bounded by a maximum extra wait per request.

Prediction (cheap, no forward pass):
  - a running sequence: the experts its last token chose in every MoE layer (engine/routing.py);
  - a waiting request: its prompt's dominant experts — each MoE layer's router applied to the
    normed embeddings of its last PROMPT_TOKENS tokens, the layer's K most chosen experts
    (computed once per request). Keys are layer_row · E + expert.

Choice, each step (`Scheduler._admit` asks `pick` for the next request while budget, sequence
slots and KV blocks last):
  1. forced first, in queue order: a preempted sequence (FCFS re-admits it first too), and any
     request *overdue* for max_wait steps — overdue from the first step in which FCFS order would
     have admitted it (it was among the first n of the queue, n = the requests admitted in that
     step) and it was passed over;
  2. otherwise, among the waiting requests of the queue head's priority (priorities are kept), the
     one that adds the fewest experts to those the step wakes (its running sequences', and the
     admitted ones' predictions), ties in queue order.
So a request waits at most max_wait steps beyond the step FCFS order would have admitted it, when
a sequence slot and budget are free at that step (admission otherwise waits for them, as under
FCFS). A candidate that does not fit ends the step's admissions, as the queue head does under FCFS.
Tenants' token-rate limits act before the engine (serve) and the decode QoS policy
(`StepPolicy`) is consulted as under FCFS: affinity only reorders admissions.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch

from moetune.engine.sequence import Sequence

PROMPT_TOKENS = 64  # the prompt's last tokens whose routing predicts a waiting request's experts


class PromptExperts:
    """prompt ids → the keys of its dominant experts per MoE layer (see the module docstring)."""

    def __init__(self, model):
        from moetune.moe.layer import MoELayer

        self.model = model
        self.layers = [layer for layer in model.layers if isinstance(layer.mlp, MoELayer)]
        self.E = model.spec.moe.num_experts if self.layers else 0

    @torch.inference_mode()
    def __call__(self, ids: list[int]) -> frozenset[int]:
        if not self.layers or not ids:
            return frozenset()
        tokens = torch.tensor(ids[-PROMPT_TOKENS:], device=self.model.device)
        h = self.model.embed_tokens(tokens)  # [n, D]
        keys = []
        for j, layer in enumerate(self.layers):
            chosen = layer.mlp.predict(layer.mlp_norm(h))  # [n, K]
            counts = torch.bincount(chosen.reshape(-1).cpu(), minlength=self.E)  # [E]
            top = torch.argsort(-counts, stable=True)[: chosen.shape[1]]  # [K] the most chosen
            keys += [j * self.E + int(e) for e in top if counts[e] > 0]
        return frozenset(keys)


class AffinityAdmission:
    def __init__(self, max_wait: int, predict: Callable[[list[int]], frozenset[int]]):
        self.max_wait, self.predict = max_wait, predict
        self.step = 0
        self._predicted: dict[int, frozenset[int]] = {}  # seq_id → its prompt's prediction
        self.overdue_since: dict[int, int] = {}  # seq_id → first step FCFS order would have admitted it
        self._snapshot: list[Sequence] = []
        self._woken: set[int] = set()
        self.admitted_now: list[Sequence] = []

    def experts_of(self, seq: Sequence) -> frozenset[int]:
        if seq.last_experts:
            return seq.last_experts
        if seq.seq_id not in self._predicted:
            self._predicted[seq.seq_id] = self.predict(seq.prompt_ids)
        return self._predicted[seq.seq_id]

    def forced(self, seq: Sequence) -> bool:
        if seq.output_ids:  # preempted: re-admitted first, as under FCFS
            return True
        since = self.overdue_since.get(seq.seq_id)
        return since is not None and self.step - since >= self.max_wait

    def start(self, waiting: deque[Sequence], scheduled: list[Sequence]) -> None:
        self.step += 1
        self._snapshot = list(waiting)  # the FCFS order of this step
        self._woken = set().union(*(self.experts_of(s) for s in scheduled)) if scheduled else set()
        self.admitted_now = []

    def pick(self, waiting: deque[Sequence]) -> int:
        """Index in `waiting` of the next request to try."""
        for i, seq in enumerate(waiting):
            if self.forced(seq):
                return i
        head = waiting[0].priority
        best, best_cost = 0, None
        for i, seq in enumerate(waiting):
            if seq.priority != head:
                break  # the queue is ordered by priority
            cost = len(self.experts_of(seq) - self._woken)
            if best_cost is None or cost < best_cost:
                best, best_cost = i, cost
        return best

    def admitted(self, seq: Sequence) -> None:
        self._woken |= self.experts_of(seq)
        self.admitted_now.append(seq)
        self.overdue_since.pop(seq.seq_id, None)

    def done(self) -> None:
        """After the step's admissions: the first n of the FCFS order not admitted are overdue."""
        taken = {s.seq_id for s in self.admitted_now}
        for seq in self._snapshot[: len(self.admitted_now)]:
            if seq.seq_id not in taken:
                self.overdue_since.setdefault(seq.seq_id, self.step)

    def forget(self, seq: Sequence) -> None:
        """A finished or aborted request."""
        self._predicted.pop(seq.seq_id, None)
        self.overdue_since.pop(seq.seq_id, None)
