"""Routing bookkeeping of an MoE layer on CPU: top-k selection, permute and unpermute, one numba
call each instead of a chain of small torch ops (softmax, topk, gather, div; index_add, cumsum,
argsort, index_select; index_copy, mul, sum). In a decode step every small op runs on caches
that the last weight-streaming kernel flushed, so the count of ops is what costs (docs/cpu.md).

  select_topk(logits [T, E], spec, bias) → (weights [T, K] fp32, ids [T, K] int64)
  permute_rows(x [T, D], slot_ids [T, K], P) → (sorted_copy_ids [T*K], counts [P], offsets [P+1], x_sorted [T*K, D])
  unpermute_rows(y_sorted [T*K, D], sorted_copy_ids, topk_weights [T, K], shared [T, D] | None) → [T, D]

The outputs mean exactly what the torch phases' outputs mean (`moetune.moe.router`,
`moe.permute`, `moe.unpermute`: the twins, compared in tests); the sort is a stable counting sort.
One thread; every size works (prefill included). fp32 CPU tensors; group-limited routing is not
here (the caller keeps torch for it).
"""

from __future__ import annotations

import torch

from moetune.kernels.cpu.records import Router, projection
from moetune.kernels.cpu.runtime import fp32_cpu, jit, numpy_view, ones
from moetune.kernels.layout import RouterParams


def takes_routing(spec: RouterParams) -> bool:
    """Whether `select_topk` computes this router (group-limited routing stays on torch)."""
    return spec.n_group <= 1 or spec.topk_group >= spec.n_group


def router_record(gate_weight: torch.Tensor, spec: RouterParams, bias: torch.Tensor | None = None) -> Router:
    """A router as the fused decode layer takes it (`records.Router`): gate_weight [E, D] fp32 CPU
    (a view), the selection bias [E] (or an unread one), and `select_topk`'s settings."""
    b = ones(1) if bias is None else bias.float()  # [E]
    return Router(projection(gate_weight), numpy_view(b), bias is not None, spec.score == "sigmoid", int(spec.top_k),
                  bool(spec.renormalize), float(spec.scaling_factor))


def select_topk(logits: torch.Tensor, spec: RouterParams, bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp32 → (weights [T, K] fp32, ids [T, K] int64): the K best of softmax (or
    sigmoid) scores (+ bias, which only picks), best first; weights are the unbiased scores. The
    signature of `select_experts_ref`, its twin."""
    T, E = logits.shape
    if not fp32_cpu(logits) or not 0 < spec.top_k <= E \
            or not takes_routing(spec):
        raise ValueError(f"select_topk takes fp32 CPU logits [T, E], 0 < top_k <= E and no group limit; got "
                         f"{tuple(logits.shape)} {logits.dtype}, top_k={spec.top_k}, {spec.topk_group} of "
                         f"{spec.n_group} groups")
    weights = torch.empty(T, spec.top_k)  # [T, K]
    ids = torch.empty(T, spec.top_k, dtype=torch.int64)  # [T, K]
    scores = torch.empty(T, E)  # [T, E] scratch
    b = ones(1) if bias is None else bias.float().contiguous()  # [E] (unread without a bias)
    jit().select_topk(logits.contiguous().numpy(), b.numpy(), bias is not None, spec.score == "sigmoid",
                      spec.top_k, spec.renormalize, float(spec.scaling_factor), weights.numpy(), ids.numpy(),
                      scores.numpy())
    return weights, ids


def permute_rows(x: torch.Tensor, slot_ids: torch.Tensor, num_slots: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, D] fp32, slot_ids [T, K] in [0, P) → (sorted_copy_ids, counts, offsets, x_sorted)."""
    T, K = slot_ids.shape
    if not fp32_cpu(x) or x.shape[0] != T:
        raise ValueError(f"permute_rows takes fp32 CPU x [T, D] with slot_ids [T, K]; got {tuple(x.shape)}, "
                         f"{tuple(slot_ids.shape)}")
    ids = slot_ids.to(torch.int64).contiguous()  # [T, K]
    counts = torch.empty(num_slots, dtype=torch.int64)  # [P]
    offsets = torch.empty(num_slots + 1, dtype=torch.int64)  # [P+1]
    sorted_copy_ids = torch.empty(T * K, dtype=torch.int64)  # [T*K]
    x_sorted = torch.empty(T * K, x.shape[1])  # [T*K, D]
    if not jit().permute_rows(x.contiguous().numpy(), ids.numpy(), counts.numpy(), offsets.numpy(),
                              sorted_copy_ids.numpy(), x_sorted.numpy()):
        raise ValueError(f"slot ids must be in [0, {num_slots})")
    return sorted_copy_ids, counts, offsets, x_sorted


def unpermute_rows(y_sorted: torch.Tensor, sorted_copy_ids: torch.Tensor, topk_weights: torch.Tensor,
                   shared: torch.Tensor | None = None) -> torch.Tensor:
    """y_sorted [T*K, D] fp32 in sorted order → [T, D]: Σ_k weight · row of copy t*K + k (+ shared)."""
    T, K = topk_weights.shape
    if y_sorted.dtype != torch.float32 or y_sorted.shape[0] != T * K or sorted_copy_ids.shape != (T * K,):
        raise ValueError(f"unpermute_rows takes fp32 y_sorted [T*K, D] and sorted_copy_ids [T*K] for topk_weights "
                         f"[T, K]; got {tuple(y_sorted.shape)}, {tuple(sorted_copy_ids.shape)}, {(T, K)}")
    D = y_sorted.shape[1]
    out = torch.zeros(T, D) if shared is None else shared.float().clone()  # [T, D]
    jit().unpermute_rows(y_sorted.contiguous().numpy(), sorted_copy_ids.to(torch.int64).contiguous().numpy(),
                         topk_weights.float().contiguous().numpy(), out.numpy())
    return out
