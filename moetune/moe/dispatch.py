"""Phases `dispatch` and `combine`: move token copies to the rank that owns their slot, and back.

`MoELayer` is given a `Dispatcher`. With one expert-parallel rank (R = 1) the `LocalDispatcher`
moves nothing; an all-to-all dispatcher (torch.distributed) implements the same two calls and
reports the bytes it moved, which the layer hands to the probe.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

from moetune.moe.permute import PermuteOutput


class DispatchOutput(NamedTuple):
    x: torch.Tensor  # [N, D] rows this rank computes, grouped by local slot
    offsets: torch.Tensor  # [P_local+1] segment start of each local slot
    bytes_sent: int  # activation bytes that left this rank
    state: Any = None  # what `combine` needs to send the rows back (e.g. all-to-all split sizes)


class CombineOutput(NamedTuple):
    y_sorted: torch.Tensor  # [T*K, D] expert outputs back on the source rank, in sorted order
    bytes_sent: int


class Dispatcher(Protocol):
    def dispatch(self, perm: PermuteOutput) -> DispatchOutput: ...

    def combine(self, y: torch.Tensor, sent: DispatchOutput) -> CombineOutput: ...


class LocalDispatcher:
    """R = 1: every slot is local; both phases are identities (its counters, the all-to-all
    dispatcher's, stay zero: a profile of a tensor-parallel mesh without EP reads them alike)."""

    wire_dtype = None

    def __init__(self):
        self.reset_stats()

    def reset_stats(self) -> None:
        self.wait_s = self.transfer_s = 0.0
        self.bytes_sent = self.calls = 0

    def dispatch(self, perm: PermuteOutput) -> DispatchOutput:
        return DispatchOutput(perm.x_sorted, perm.offsets, 0)

    def combine(self, y: torch.Tensor, sent: DispatchOutput) -> CombineOutput:
        return CombineOutput(y, 0)
