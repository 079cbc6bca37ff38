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
    # the mesh (cost/mesh.py): 0 keeps the one above (attention DP = ep_size, TP = tp_size; experts EP = ep_size ×
    # TP = expert_tp_size); n > 0: attention DP n × TP tp_size over the same ep_size × expert_tp_size GPUs
    attn_dp: int = 0
    moe_a2a: int = 1  # under attn_dp > 0: 1 all-to-all dispatch (DeepEP; pure EP), 0 all-gather + reduce-scatter
    # disaggregated prefill/decode (cost/disagg.py): 0 aggregated; P > 0 prefill workers beside `decode_workers`
    # decode workers (the fields above are a decode worker's), each prefill worker its own mesh and batch
    prefill_workers: int = 0
    decode_workers: int = 1
    prefill_ep: int = 1  # a prefill worker's expert-parallel size
    prefill_tp: int = 1  # ... its attention TP (attention DP = prefill_ep · prefill_expert_tp / prefill_tp)
    prefill_expert_tp: int = 1  # ... its expert TP
    prefill_tokens: int = 8192  # ... its tokens per step (per attention-DP rank)

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
        if self.attn_dp:
            parts.append(mesh_label(self))
        if self.prefill_workers:
            parts.insert(0, f"{self.prefill_workers}P[EP{self.prefill_ep}/TP{self.prefill_tp}/eTP{self.prefill_expert_tp}"
                            f" tok={self.prefill_tokens}] + {self.decode_workers}D ×")
        return " ".join(parts)


def mesh_label(d: Deployment) -> str:
    """attention DP × TP / experts EP × TP and how tokens reach the experts (general meshes only)."""
    how = "a2a" if d.moe_a2a and d.ep_size > 1 else "gather"
    return f"attn DP{d.attn_dp}×TP{d.tp_size} / moe EP{d.ep_size}×TP{d.expert_tp_size} {how}"


def gpus(d: Deployment) -> int:
    """GPUs of one replica (one worker under disaggregation): ep_size × expert_tp_size under a general mesh
    (attn_dp > 0), else ep_size × the TP group max(tp_size, expert_tp_size)."""
    if d.attn_dp:
        return d.ep_size * d.expert_tp_size
    return d.ep_size * max(d.tp_size, d.expert_tp_size)


def dp_ranks(d: Deployment) -> int:
    """Attention data-parallel ranks of one replica: the groups requests are spread over."""
    return d.attn_dp or d.ep_size


def resident_slots(d: Deployment, num_experts: int) -> int:
    """Expert slots kept resident per rank and MoE layer: the fraction of the rank's slots, rounded up
    (as the engine rounds `offload.resident_fraction`)."""
    slots = (num_experts + d.redundant_experts) // max(d.ep_size, 1)
    return min(slots, math.ceil(slots * d.offload_resident_fraction - 1e-9))
