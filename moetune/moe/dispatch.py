"""Phases `dispatch` and `combine`: move token copies to the rank that owns their expert and back.

With one expert-parallel rank (R = 1) both are identities; the all-to-all versions plug in here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from moetune.moe.permute import PermuteOutput


class DispatchOutput(NamedTuple):
    x_local: torch.Tensor  # [N_local, D] rows this rank computes, grouped by local expert
    offsets: torch.Tensor  # [E_local+1] segment starts of each local expert
    bytes_sent: int  # activation bytes that left this rank


class CombineOutput(NamedTuple):
    y_sorted: torch.Tensor  # [T*K, D] expert outputs back on the source rank, in permuted order
    bytes_sent: int


def dispatch_local(perm: PermuteOutput) -> DispatchOutput:
    return DispatchOutput(perm.x_sorted, perm.offsets, 0)


def combine_local(y_local: torch.Tensor) -> CombineOutput:
    return CombineOutput(y_local, 0)
