"""Optional per-expert capacity, applied to the router's choices (part of phase `router`).

capacity C = ceil(cf · T · K / E) copies per logical expert, T = this rank's tokens in the step.
Copies are ranked by routing weight, highest first (ties: lower flat index t·K + k first); an
expert keeps its first C copies. The overflow:
- `drop`: the copy is dropped — its weight becomes 0, so it adds nothing to the token's output;
- `reroute`: in the same order, the copy moves to the token's next-best expert (router score
  order) that still has room and that the token has not chosen; it keeps its weight. With no such
  expert it is dropped;
- `buffer`: the copy keeps its expert and its weight and is computed in a second pass of the same
  step (moe/passes.py): the first pass holds at most C copies per expert, nothing is lost.
Counts are exact and returned, with the mask `over` of the copies beyond capacity (dropped or
buffered). The MoE layer computes only the copies within capacity in its first pass: a dropped copy
neither travels nor is computed (moe/passes.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

POLICIES = ("none", "drop", "reroute", "buffer")


class CapacityOutput(NamedTuple):
    topk_ids: torch.Tensor  # [T, K]
    topk_weights: torch.Tensor  # [T, K]
    dropped: int  # copies whose weight became 0
    rerouted: int  # copies moved to another expert
    over: torch.Tensor | None = None  # [T, K] bool: beyond capacity (dropped, or buffered for the second pass)
    buffered: int = 0  # copies left for the second pass (`buffer`)


def capacity_of(factor: float, num_tokens: int, top_k: int, num_experts: int) -> int:
    return math.ceil(factor * num_tokens * top_k / num_experts)


def apply_capacity(topk_ids: torch.Tensor, topk_weights: torch.Tensor, scores: torch.Tensor, capacity: int,
                   policy: str) -> CapacityOutput:
    """topk_ids, topk_weights [T, K]; scores [T, E] (higher = preferred) rank the reroute targets."""
    T, K = topk_ids.shape
    if policy == "none" or T == 0:
        return CapacityOutput(topk_ids, topk_weights, 0, 0, torch.zeros_like(topk_ids, dtype=torch.bool))
    E = scores.shape[1]
    flat_ids, flat_w = topk_ids.reshape(-1), topk_weights.reshape(-1)  # [T*K]
    order = torch.argsort(-flat_w.float(), stable=True)  # [T*K] copies, heaviest first
    by_expert = torch.argsort(flat_ids[order], stable=True)  # within an expert: heaviest first
    sorted_ids = flat_ids[order][by_expert]
    starts = torch.searchsorted(sorted_ids, sorted_ids, side="left")
    rank = torch.empty_like(flat_ids)
    rank[order[by_expert]] = torch.arange(T * K, device=flat_ids.device) - starts  # [T*K] place in its expert's queue
    over = rank >= capacity  # [T*K]
    ids, weights = flat_ids.clone(), flat_w.clone()
    rerouted = 0
    if policy == "reroute" and bool(over.any()):
        room = capacity - torch.bincount(flat_ids[~over], minlength=E)  # [E]
        prefs = torch.argsort(scores.float(), dim=1, descending=True, stable=True)  # [T, E]
        overflow = [int(c) for c in order.tolist() if over[c]]  # in weight order
        room_l, chosen = room.tolist(), topk_ids.tolist()
        for copy in overflow:
            t = copy // K
            target = next((int(e) for e in prefs[t].tolist() if room_l[e] > 0 and e not in chosen[t]), None)
            if target is None:
                continue
            room_l[target] -= 1
            chosen[t][copy % K] = target
            ids[copy] = target
            over[copy] = False
            rerouted += 1
    n_over = int(over.sum())
    if policy == "buffer":
        return CapacityOutput(topk_ids, topk_weights, 0, 0, over.view(T, K), n_over)
    weights[over] = 0
    return CapacityOutput(ids.view(T, K), weights.view(T, K), n_over, rerouted, over.view(T, K))
