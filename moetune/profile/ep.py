"""Expert-parallel traffic computed on one process from a recorded routing.

Placement (default contiguous): expert e lives on rank e // (E / R). Token origin rule: token t
of a step (its index in the step's flattened [T] batch) starts on rank t % R, as with
data-parallel attention. Node of a rank: rank // ranks_per_node.

Each token copy is sent to its expert's rank (dispatch) and its output returned (combine), so a
copy moves D · dtype_bytes twice. A copy whose expert lives on its own rank moves no bytes over
any link; those bytes are counted as `same_rank`. Others are `intra_node` or `inter_node`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moetune.moe.placement import check_ep


@dataclass(frozen=True)
class EPLayout:
    num_experts: int  # E
    ep_size: int  # R
    ranks_per_node: int  # N
    placement: np.ndarray  # [E] owning rank of each expert

    def node(self, rank: np.ndarray) -> np.ndarray:
        return rank // self.ranks_per_node


def contiguous_layout(num_experts: int, ep_size: int, ranks_per_node: int) -> EPLayout:
    check_ep(num_experts, ep_size, ranks_per_node=ranks_per_node)
    placement = np.arange(num_experts) // (num_experts // ep_size)  # [E]
    return EPLayout(num_experts, ep_size, ranks_per_node, placement)


@dataclass(frozen=True)
class StepTraffic:
    copies_in: np.ndarray  # [R] token copies each rank computes
    send_bytes: np.ndarray  # [R] bytes each rank puts on a link (dispatch out + combine out)
    recv_bytes: np.ndarray  # [R] bytes each rank takes off a link
    same_rank: int  # bytes that stay on their rank (dispatch + combine)
    intra_node: int  # bytes between ranks of one node
    inter_node: int  # bytes between nodes


def step_traffic(topk_ids: np.ndarray, layout: EPLayout, row_bytes: int) -> StepTraffic:
    """topk_ids: [T, K] one layer's routing in one step; row_bytes = D · dtype bytes."""
    T, K = topk_ids.shape
    R = layout.ep_size
    src = np.repeat(np.arange(T) % R, K)  # [T*K] origin rank of each copy
    dst = layout.placement[topk_ids.reshape(-1)]  # [T*K] owning rank
    moved = src != dst  # [T*K]
    same_node = layout.node(src) == layout.node(dst)  # [T*K]
    both_ways = 2 * row_bytes  # dispatch there + combine back
    copies_in = np.bincount(dst, minlength=R)
    out_links = np.bincount(src[moved], minlength=R) + np.bincount(dst[moved], minlength=R)  # [R]
    return StepTraffic(
        copies_in=copies_in,
        send_bytes=out_links * row_bytes,  # a rank sends dispatches out and combines back
        recv_bytes=out_links * row_bytes,  # and receives as many rows as it sends, mirrored
        same_rank=int((~moved).sum()) * both_ways,
        intra_node=int((moved & same_node).sum()) * both_ways,
        inter_node=int((moved & ~same_node).sum()) * both_ways,
    )
