"""/metrics of a server over R ranks: per-rank engine state, load, communication; the expert load of
all ranks together (for the metrics one rank has).

Read on scrape from what the ranks last reported to rank 0 (serve/rank_worker.py): engine gauges
after every lock-step, each rank's expert-load window every LOAD_EVERY lock-steps and on idle ticks.
Over a tensor-parallel mesh a "rank" here is a DP group (label `rank="d"`), as its TP rank 0
reports it: the group's other ranks hold the same sequences and route the same tokens.
"""

from __future__ import annotations

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from moetune.profile.metrics import per_layer_stats


class RanksLoad:
    """The expert-load window of every rank summed: what `ExpertLoadWindow.stats` gives for one rank."""

    def __init__(self, worker, layers: list[int], num_experts: int):
        self.worker, self.layers, self.num_experts = worker, layers, num_experts

    def counts(self) -> np.ndarray:
        """[Lm, E] token copies per layer and expert over the ranks' windows."""
        total = np.zeros((len(self.layers), self.num_experts), dtype=np.int64)
        for load in self.worker.loads:
            if load is not None:
                total += load
        return total

    def stats(self):
        counts = self.counts()
        return list(zip(self.layers, counts, per_layer_stats(counts)))

    def distinct_per_step(self) -> np.ndarray:
        """Not gathered over ranks (each rank's window holds its own steps): empty, so /metrics
        leaves moetune_distinct_experts_per_step without samples over R ranks."""
        return np.zeros(0, dtype=np.int64)


class RankCollector:
    """Per-rank gauges and counters, and how requests are assigned to ranks."""

    def __init__(self, worker, placement=None):
        self.worker = worker
        self.placement = placement  # moe.placement.Placement: which rank computes each expert's copies

    def describe(self):
        return []  # collected on scrape only

    def collect(self):
        w = self.worker
        gauges = [
            ("moetune_rank_running_sequences", "Sequences running on each rank", "running"),
            ("moetune_rank_queue_depth", "Sequences waiting on each rank", "waiting"),
            ("moetune_rank_kv_blocks_used", "KV-cache blocks in use on each rank", "kv_blocks_used"),
            ("moetune_rank_kv_blocks_total", "KV-cache blocks in each rank's pool", "kv_blocks_total"),
            ("moetune_rank_work_tokens", "Tokens of each rank's running and waiting sequences (prompt + generated): "
             "a new sequence goes to the rank with the least (least-work assignment)", "work_tokens"),
        ]
        for name, doc, attr in gauges:
            family = GaugeMetricFamily(name, doc, labels=["rank"])
            for r, snap in enumerate(w.ranks):
                family.add_metric([str(r)], getattr(snap, attr))
            yield family
        counters = [
            ("moetune_rank_lock_steps", "Lock-steps taken by each rank (idle ones included)", "lock_steps"),
            ("moetune_rank_idle_lock_steps", "Lock-steps a rank ran the empty forward (no work of its own)",
             "idle_steps"),
            ("moetune_rank_dispatch_combine_bytes", "Bytes of token rows each rank sent in the MoE all-to-alls "
             "(dispatch + combine)", "bytes_sent"),
            ("moetune_rank_dispatch_combine_seconds", "Seconds each rank spent moving rows in the all-to-alls",
             "transfer_s"),
            ("moetune_rank_wait_slowest_seconds", "Seconds each rank waited in the all-to-alls for the slowest rank "
             "to reach the layer", "wait_s"),
        ]
        for name, doc, attr in counters:
            family = CounterMetricFamily(name, doc, labels=["rank"])
            for r, snap in enumerate(w.ranks):
                family.add_metric([str(r)], float(getattr(snap, attr)))
            yield family
        assigned = CounterMetricFamily("moetune_rank_assigned_sequences", "Sequences assigned to each rank "
                                       "(policy: least work = running + waiting tokens)", labels=["rank", "policy"])
        for r, n in enumerate(w.assigned):
            assigned.add_metric([str(r), "least_work"], float(n))
        yield assigned
        yield from self._load()

    def _load(self):
        own = GaugeMetricFamily("moetune_rank_expert_balancedness", "mean/max expert load per layer of the tokens "
                                "each rank serves, over its window (1 = even)", labels=["rank", "layer"])
        layers = list(self.placement.layers) if self.placement is not None else []
        for r, load in enumerate(self.worker.loads):
            if load is None or not load.any():  # nothing routed from this rank's tokens in the window
                continue
            for layer, stats in zip(layers, per_layer_stats(load)):
                own.add_metric([str(r), str(layer)], stats.balancedness)
        yield own
        if self.placement is None:
            return
        computed = GaugeMetricFamily("moetune_rank_computed_copies", "Token copies the experts on each rank computed "
                                     "over the window (replicas share their expert's copies evenly)",
                                     labels=["rank", "layer"])
        balance = GaugeMetricFamily("moetune_rank_balancedness", "mean/max over ranks of the copies their experts "
                                    "computed, per layer (1 = even)", labels=["layer"])
        per_rank = rank_copies(RanksLoad(self.worker, layers, self.placement.num_experts).counts(), self.placement)
        for layer, row, stats in zip(layers, per_rank, per_layer_stats(per_rank)):
            for r, n in enumerate(row):
                computed.add_metric([str(r), str(layer)], float(n))
            balance.add_metric([str(layer)], stats.balancedness)
        yield from (computed, balance)


def rank_copies(counts: np.ndarray, placement) -> np.ndarray:
    """counts [Lm, E] copies per logical expert → [Lm, R] copies computed on each rank's slots (a
    replicated expert's copies split evenly over its slots, as the token-index rule does on average)."""
    phy = placement.phy2log  # [Lm, P]
    replicas = np.stack([np.bincount(row, minlength=placement.num_experts) for row in phy])  # [Lm, E]
    per_slot = np.take_along_axis(counts / np.maximum(replicas, 1), phy, axis=1)  # [Lm, P]
    return per_slot.reshape(len(phy), placement.ep_size, placement.slots_per_rank).sum(-1)  # [Lm, R]
