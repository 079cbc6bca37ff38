"""AlignedLayout: token copies sorted by expert and padded per expert to a multiple of BLOCK_M.

Produced by `align.align_block_size` (or its torch twin) and read by the grouped GEMM. A token copy
is one (token t, slot k) pair with flat index t * K + k; padding slots hold the sentinel T * K.
Buffers are sized for the worst case so that no host sync is needed to launch the GEMM; only the
first `num_tokens_post_padded` rows (and their blocks) are in use, the rest hold sentinel / -1.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class AlignedLayout(NamedTuple):
    sorted_token_ids: torch.Tensor  # [max_padded] int32 flat copy index per row, T*K = padding
    expert_ids: torch.Tensor  # [max_blocks] int32 physical slot per BLOCK_M rows, -1 = skip
    num_tokens_post_padded: torch.Tensor  # [1] int32 rows in use
    counts: torch.Tensor  # [E] int32 token copies per logical expert
    offsets: torch.Tensor  # [E+1] int32 unpadded segment starts
    padded_offsets: torch.Tensor  # [E+1] int32 padded segment starts
    block_m: int
    top_k: int


def max_padded_rows(num_copies: int, num_experts: int, block_m: int) -> int:
    """Worst-case rows after padding: every non-empty expert may add up to BLOCK_M - 1 rows."""
    return num_copies + num_experts * (block_m - 1)


def num_blocks(num_rows: int, block_m: int) -> int:
    return (num_rows + block_m - 1) // block_m


class RouterParams(Protocol):
    """What the router kernels read of a router description (moetune's RouterSpec satisfies it)."""

    score: str  # "softmax" | "sigmoid"
    top_k: int
    renormalize: bool
    n_group: int
    topk_group: int
    scaling_factor: float
