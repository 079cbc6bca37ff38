"""Phase `permute`: count token copies per expert, prefix-sum, and sort the copies by expert.

A token copy is one (token t, slot k) pair; its flat index is t * K + k. Kernels that run one
expert's rows in blocks of BLOCK_M pad every expert's segment to a multiple of BLOCK_M; the
padding they would add is reported here as waste.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from moetune.kernels.layout import AlignedLayout

DEFAULT_BLOCK_M = 64


class PermuteOutput(NamedTuple):
    sorted_copy_ids: torch.Tensor  # [T*K] flat copy index, grouped by expert (stable within one)
    counts: torch.Tensor  # [E] token copies per expert
    offsets: torch.Tensor  # [E+1] start of each expert's segment in sorted order
    x_sorted: torch.Tensor  # [T*K, D] token rows in expert order; [T, D] token order when `aligned` is set
    padded_rows: int  # rows after padding each non-empty expert to a multiple of block_m
    aligned: "AlignedLayout | None" = None  # triton backend: the padded block layout its grouped GEMM gathers by


def permute(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, block_m: int = DEFAULT_BLOCK_M) -> PermuteOutput:
    T, K = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)  # [T*K]
    counts = torch.bincount(flat_ids, minlength=num_experts)  # [E]
    offsets = torch.zeros(num_experts + 1, dtype=torch.long, device=x.device)
    offsets[1:] = torch.cumsum(counts, 0)  # [E+1]
    sorted_copy_ids = torch.argsort(flat_ids, stable=True)  # [T*K]
    x_sorted = x.index_select(0, sorted_copy_ids // K)  # [T*K, D]
    padded = int((((counts + block_m - 1) // block_m) * block_m).sum())
    return PermuteOutput(sorted_copy_ids, counts, offsets, x_sorted, padded)
