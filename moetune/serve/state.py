"""ServerState: what the HTTP handlers share — the engine worker, metrics, limits, the recorder.

Mutated only on the event loop's thread (the handlers), except what the worker owns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moetune.config import RunConfig
from moetune.serve.expert_load import ExpertLoadWindow
from moetune.serve.metrics import ServeMetrics
from moetune.serve.recording import Recorder
from moetune.serve.tenants import TenantLimiter
from moetune.serve.worker import EngineWorker


@dataclass
class ServerState:
    config: RunConfig
    generator: object  # moetune.engine.generate.Generator (the engine inside belongs to the worker thread)
    worker: EngineWorker
    window: ExpertLoadWindow
    metrics: ServeMetrics
    recorder: Recorder
    tenants: TenantLimiter
    model_name: str
    api_key: str | None
    expert_flops_per_token: float  # Σ over MoE layers of K · 6·D·I
    replicas: int = 1  # ranks that each run max_num_seqs sequences (parallel.ep_size)
    inflight: int = 0  # sequences admitted and not yet answered (running or queued)
    draining: bool = False

    @property
    def capacity(self) -> int:
        return self.running_capacity + self.config.serve.max_queue

    @property
    def running_capacity(self) -> int:
        return self.config.engine.max_num_seqs * self.replicas

    @property
    def max_len(self) -> int:
        return self.generator.engine.max_len

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.generator.eos_ids

    def retry_after_s(self) -> int:
        """Seconds until a queue slot is likely free: the queue over the running set, ~1 s per round, ≥ 1."""
        rounds = max(self.inflight - self.running_capacity, 0) / self.running_capacity
        return max(1, math.ceil(rounds))
