"""Phase `permute`: count token copies per physical expert slot, prefix-sum, sort the copies by slot.

A token copy is one (token t, choice k) pair; its flat index is t * K + k. The output means the
same under every kernel backend and costs no host sync: counts come from a scatter-add (not
`bincount`, which reads the maximum back on CUDA), the order from a stable sort.
Kernels that run one expert's rows in blocks of `block_m` pad each segment to a multiple of it;
that padding is reported by the profiler from `counts` (see `padded_rows`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

class PermuteOutput(NamedTuple):
    sorted_copy_ids: torch.Tensor  # [T*K] flat copy index, grouped by slot (stable within one)
    counts: torch.Tensor  # [P] token copies per physical slot
    offsets: torch.Tensor  # [P+1] start of each slot's segment in sorted order
    x_sorted: torch.Tensor  # [T*K, D] token rows in sorted order


def permute(x: torch.Tensor, slot_ids: torch.Tensor, num_slots: int) -> PermuteOutput:
    """x [T, D], slot_ids [T, K] physical slots → PermuteOutput."""
    K = slot_ids.shape[1]
    flat = slot_ids.reshape(-1)  # [T*K]
    counts = torch.zeros(num_slots, dtype=torch.long, device=x.device).index_add_(
        0, flat, torch.ones_like(flat))  # [P]
    offsets = torch.zeros(num_slots + 1, dtype=torch.long, device=x.device)
    offsets[1:] = torch.cumsum(counts, 0)  # [P+1]
    sorted_copy_ids = torch.argsort(flat, stable=True)  # [T*K]
    x_sorted = x.index_select(0, sorted_copy_ids // K)  # [T*K, D]
    return PermuteOutput(sorted_copy_ids, counts, offsets, x_sorted)

