"""Per-tenant expert QoS: a tenant's decodes may take at most `expert_share` of each expert's
capacity in a step; the scheduler holds the rest back a step (`engine.scheduler.StepPolicy`).

An expert's capacity in a step is ceil(capacity_factor · B · K / E) token copies, B = decodes
asking to run. A decode's experts are not known before its forward, so each sequence's next
routing is predicted by its previous token's (consecutive tokens of a sequence tend to reuse
experts); a sequence with no routing yet (just prefilled) is not counted. Every tenant gets at
least one decode per step, so nothing starves and the engine always progresses. Holding a decode
back only delays it: the tokens a request gets are the same.

Runs on the engine thread (the scheduler calls it; the worker feeds it each step's routing).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from moetune.engine.scheduler import SchedulerOutput
from moetune.engine.sequence import Sequence


class ExpertQoS:
    def __init__(self, shares: dict[str, float], num_layers: int, num_experts: int, top_k: int,
                 capacity_factor: float = 1.0, on_defer=None):
        self.shares = shares  # tenant → share of each expert's per-step capacity
        self.Lm, self.E, self.K, self.cf = num_layers, num_experts, top_k, capacity_factor
        self.on_defer = on_defer  # called with the tenant of each decode held back
        self.tenant_of: dict[int, str] = {}  # seq_id → tenant, for the tenants with a share
        self.predicted: dict[int, np.ndarray] = {}  # seq_id → [Lm, K] experts of its latest token
        self._used: dict[str, np.ndarray] = {}
        self._rows: list[tuple[int, int]] = []  # (seq_id, row of its last token) of the latest step
        self._cap = 0

    # bookkeeping (engine thread) ---------------------------------------------------------------
    def track(self, seq_id: int, tenant: str) -> None:
        if tenant in self.shares:
            self.tenant_of[seq_id] = tenant

    def forget(self, seq_id: int) -> None:
        self.tenant_of.pop(seq_id, None)
        self.predicted.pop(seq_id, None)

    # StepPolicy ------------------------------------------------------------------------------------
    def begin(self, running: list[Sequence]) -> None:
        decodes = sum(not s.in_prefill for s in running)
        self._cap = math.ceil(self.cf * decodes * self.K / self.E)
        self._used = {}

    def allow_decode(self, seq: Sequence) -> bool:
        tenant = self.tenant_of.get(seq.seq_id)
        if tenant is None:
            return True
        pred = self.predicted.get(seq.seq_id)  # [Lm, K]
        first = tenant not in self._used
        used = self._used.setdefault(tenant, np.zeros((self.Lm, self.E), dtype=np.int64))  # [Lm, E]
        if pred is None:
            return True
        new = used.copy()
        np.add.at(new, (np.arange(self.Lm)[:, None], pred), 1)
        if not first and (new > self.shares[tenant] * self._cap).any():
            if self.on_defer is not None:
                self.on_defer(tenant)
            return False
        self._used[tenant] = new
        return True

    def scheduled(self, out: SchedulerOutput) -> None:
        ends = np.cumsum([e.num_tokens for e in out.entries]) - 1
        self._rows = [(e.seq.seq_id, int(end)) for e, end in zip(out.entries, ends)
                      if e.seq.seq_id in self.tenant_of]

    # after the step: what the tracked sequences' last tokens were routed to ------------------------
    def routed(self, topk_ids: list[torch.Tensor]) -> None:
        """topk_ids: per MoE layer [T, K] of the step just run."""
        if not self._rows or len(topk_ids) != self.Lm:
            return
        rows = torch.tensor([r for _, r in self._rows], device=topk_ids[0].device)
        ids = torch.stack([t.index_select(0, rows) for t in topk_ids], dim=1).cpu().numpy()  # [S, Lm, K]
        for (seq_id, _), experts in zip(self._rows, ids):
            if seq_id in self.tenant_of:
                self.predicted[seq_id] = experts
        self._rows = []
