"""Replicas of a deployment across the hardware's GPUs: each replica (ep_size ranks) runs its share
of the load, and the figures of one replica are carried to all of them.

Burst: request i goes to replica i mod replicas; replica 0, which holds the most (⌈n / replicas⌉),
is priced, and the total output rate is its tokens/s × n / ⌈n / replicas⌉ (every replica finishes
by replica 0's makespan). Steady state (`--concurrency`, `--request-rate` are per replica): every
replica carries the same load, so the total is replicas × one replica's. Latency, memory and the
per-rank figures are one replica's; throughput per GPU is the total over all the hardware's GPUs
(idle ones included).
"""

from __future__ import annotations

from dataclasses import replace

from moetune.search.cost.metrics import Metrics
from moetune.search.cost.schedule import SimWorkload


def replica_workload(w: SimWorkload, replicas: int) -> SimWorkload:
    """The workload one replica (replica 0) runs."""
    if replicas <= 1 or w.mode != "burst":
        return w
    return replace(w, prompt_lens=w.prompt_lens[::replicas])


def over_replicas(m: Metrics, w: SimWorkload, replicas: int, gpus: int) -> Metrics:
    """One replica's Metrics → the deployment's (module docstring)."""
    share = replica_workload(w, replicas).num_requests
    factor = w.num_requests / share if w.mode == "burst" else float(replicas)
    total = m.output_tok_s * factor
    return replace(m, output_tok_s=total, request_s=m.request_s * factor, goodput_rps=m.goodput_rps * factor,
                   replicas=replicas, output_tok_s_per_gpu=total / max(gpus, 1))
