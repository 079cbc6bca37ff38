"""AllToAllDispatcher: phases `dispatch` and `combine` over torch.distributed (gloo on CPU, NCCL on GPU).

Physical slots are rank-major (slot p on rank p // P_local), so after `permute` this rank's token
copies are already grouped by destination rank. Dispatch:
1. exchange split sizes: counts [R, P_local] (copies this rank sends to each rank's local slots)
   go out by `all_to_all_single`; each rank learns [R, P_local] it will receive (one host sync);
2. `all_to_all_single` the rows with those splits (uneven; a rank may send or receive nothing);
3. regroup the received rows (grouped by source rank, then slot) by local slot, stable over source.
Combine undoes 3 and sends the output rows back with the splits swapped, so they arrive in this
rank's sorted order. Bytes counted are rows that leave the rank (its own rows never cross a link).

The split-size exchange is tiny, so its duration is the time this rank waited for the slowest rank
to reach the layer (`wait_s`, accumulated for the profiler; `reset_stats` clears it).
Optional low-precision transport (`wire_dtype`, e.g. bf16): rows are cast before sending and back
after receiving, in both directions.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from moetune.moe.dispatch import CombineOutput, DispatchOutput
from moetune.moe.permute import PermuteOutput


class _Sent(NamedTuple):
    send_splits: list[int]  # [R] rows this rank sent to each rank
    recv_splits: list[int]  # [R] rows it received from each rank
    order: torch.Tensor  # [N] received row of each local-slot-ordered row


class AllToAllDispatcher:
    def __init__(self, ep_size: int, rank: int, slots_per_rank: int, group=None,
                 wire_dtype: torch.dtype | None = None):
        self.ep_size, self.rank, self.slots_per_rank = ep_size, rank, slots_per_rank
        self.group = group
        self.wire_dtype = wire_dtype
        self.reset_stats()

    def reset_stats(self) -> None:
        self.wait_s = 0.0  # in the split-size exchange: waiting for the slowest rank
        self.transfer_s = 0.0  # in the row all-to-alls (dispatch + combine)
        self.bytes_sent = 0  # rows that left this rank (dispatch + combine)
        self.calls = 0  # MoE layers dispatched

    def dispatch(self, perm: PermuteOutput) -> DispatchOutput:
        R, Pl = self.ep_size, self.slots_per_rank
        send_counts = perm.counts.view(R, Pl)  # [R, P_local] to each rank's slots
        recv_counts = torch.empty_like(send_counts)  # [R, P_local] from each rank into my slots
        start = time.perf_counter()
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        pair = torch.stack([send_counts.sum(1), recv_counts.sum(1)]).tolist()  # the one host sync
        self.wait_s += time.perf_counter() - start
        send_splits, recv_splits = pair
        recv = self._exchange(perm.x_sorted, send_splits, recv_splits)  # [N, D] by source, then slot
        slot = torch.arange(Pl, device=recv.device).repeat(R)  # [R*P_local]
        row_slot = torch.repeat_interleave(slot, recv_counts.reshape(-1), output_size=recv.shape[0])  # [N]
        order = torch.argsort(row_slot, stable=True)  # [N]
        offsets = torch.zeros(Pl + 1, dtype=torch.long, device=recv.device)
        offsets[1:] = torch.cumsum(recv_counts.sum(0), 0)  # [P_local+1]
        moved = (sum(send_splits) - send_splits[self.rank]) * self._row_bytes(perm.x_sorted)
        self.bytes_sent += moved
        self.calls += 1
        return DispatchOutput(recv.index_select(0, order), offsets, moved, _Sent(send_splits, recv_splits, order))

    def combine(self, y: torch.Tensor, sent: DispatchOutput) -> CombineOutput:
        s: _Sent = sent.state
        by_source = torch.empty_like(y).index_copy_(0, s.order, y)  # [N, D] back in received order
        back = self._exchange(by_source, s.recv_splits, s.send_splits)  # [T*K, D] in sorted order
        moved = (sum(s.recv_splits) - s.recv_splits[self.rank]) * self._row_bytes(y)
        self.bytes_sent += moved
        return CombineOutput(back, moved)

    def _exchange(self, rows: torch.Tensor, send_splits: list[int], recv_splits: list[int]) -> torch.Tensor:
        dtype = rows.dtype
        wire = rows if self.wire_dtype is None else rows.to(self.wire_dtype)
        out = wire.new_empty(sum(recv_splits), rows.shape[1])
        start = time.perf_counter()
        dist.all_to_all_single(out, wire.contiguous(), recv_splits, send_splits, group=self.group)
        self.transfer_s += time.perf_counter() - start
        return out if out.dtype == dtype else out.to(dtype)

    def _row_bytes(self, rows: torch.Tensor) -> int:
        size = (self.wire_dtype or rows.dtype).itemsize
        return rows.shape[1] * size
