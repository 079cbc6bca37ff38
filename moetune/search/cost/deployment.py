"""One point of the search space as the cost model prices it: the knobs' values. The study's space
(study/space.py) says which values each knob takes and how a point becomes a recipe."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Deployment:
    """One point of the space: the knobs' values (what-if knobs at their neutral values by default)."""

    ep_size: int = 1
    redundant_experts: int = 0
    placement: str = "contiguous"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    quant_low_format: str = "none"
    quant_hot_fraction: float = 0.0
    offload_resident_fraction: float = 1.0
    offload_prefetch_depth: int = 0
    offload_eviction: str = "lru"
    tp_size: int = 1  # tensor parallelism inside each EP group (docs/architecture.md §3d): 1 or G
    expert_tp_size: int = 1  # each expert's intermediate dim split over the G ranks: 1 or G
    replicas: int = 1  # copies of the deployment, each on its own ep_size GPUs, each with its share of the load
    capacity_policy: str = "none"  # none | drop | buffer | reroute: what a copy beyond capacity does (moe/capacity.py)
    capacity_factor: float = 1.0  # C = ceil(factor · T · K / E) copies per expert and rank's step (moot at none)
    scheduling: str = "fcfs"  # fcfs | affinity: the engine's admission order (engine/affinity.py)
    offload_hints: str = "router"  # router | history | both: where prefetch predictions come from (moot resident)
    speculative: str = "none"  # none | ngram:K | draft:DIR:K | mtp:K: drafts verified per decode (cost/speculative.py)
    # serving-engine knobs priced on GPU hardware (precision.py, overlap.py): no moetune recipe key
    dense_format: str = "none"  # none (the model dtype) | fp8: attention, dense and shared-expert MLP weights
    kv_format: str = "none"  # none (the model dtype) | fp8: the KV cache (bytes held and read per step)
    overlap: int = 0  # 1: two-batch overlap (two micro-batches, one's dispatch/combine behind the other's compute)
    cuda_graph_max_bs: int = -1  # -1: every kernel at the hardware's one per-kernel figure (as before; CPU);
    # 0: eager (no CUDA graphs); n: decode-only steps of at most n sequences per rank replay a graph

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        parts = [f"R={self.ep_size}", f"N={self.redundant_experts}", self.placement,
                 f"seqs={self.max_num_seqs}", f"tok={self.max_num_batched_tokens}"]
        if self.replicas > 1:
            parts.insert(0, f"{self.replicas} replicas ×")
        if self.quant_low_format != "none":
            parts.append(f"{self.quant_low_format}/hot={self.quant_hot_fraction:g}")
        if self.offload_resident_fraction < 1:
            parts.append(f"resident={self.offload_resident_fraction:g}/pf={self.offload_prefetch_depth}"
                         f"/{self.offload_eviction}")
        if max(self.tp_size, self.expert_tp_size) > 1:
            parts.append(f"TP={self.tp_size}/eTP={self.expert_tp_size}")
        if self.capacity_policy != "none":
            parts.append(f"cap={self.capacity_policy}×{self.capacity_factor:g}")
        if self.scheduling != "fcfs":
            parts.append(self.scheduling)
        if self.offload_hints != "router":
            parts.append(f"hints={self.offload_hints}")
        if self.speculative != "none":
            parts.append(f"spec={self.speculative}")
        if self.dense_format != "none" or self.kv_format != "none":
            parts.append(f"dense={self.dense_format}/kv={self.kv_format}")
        if self.overlap:
            parts.append("TBO")
        if self.cuda_graph_max_bs >= 0:
            parts.append(f"graphs≤{self.cuda_graph_max_bs}" if self.cuda_graph_max_bs else "eager")
        return " ".join(parts)


def resident_slots(d: Deployment, num_experts: int) -> int:
    """Expert slots kept resident per rank and MoE layer: the fraction of the rank's slots, rounded up
    (as the engine rounds `offload.resident_fraction`)."""
    slots = (num_experts + d.redundant_experts) // max(d.ep_size, 1)
    return min(slots, math.ceil(slots * d.offload_resident_fraction - 1e-9))
