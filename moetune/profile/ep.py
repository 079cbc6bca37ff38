"""Expert-parallel traffic computed on one process from a recorded routing (the what-if).

Placement: contiguous by default (expert e on rank e // (E / R)); or a run's `Placement` (physical
slots rank-major, a replicated expert's copies split over its replicas by the token's index on its
own rank, as `SlotMap.physical` does). Token origin: the rank each token was computed on when the
run ran R ranks (`origin`), otherwise token t of a step starts on rank t % R, as with data-parallel
attention. Node of a rank: rank // ranks_per_node.

Each token copy is sent to its expert's rank (dispatch) and its output returned (combine), so a
copy moves D · dtype_bytes twice. A copy whose expert lives on its own rank moves no bytes over
any link; those bytes are counted as `same_rank`. Others are `intra_node` or `inter_node`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moetune.moe.placement import Placement, check_ep


@dataclass(frozen=True)
class EPLayout:
    num_experts: int  # E
    ep_size: int  # R
    ranks_per_node: int  # N
    placement: np.ndarray  # [E] owning rank of each expert without replicas (contiguous)
    slots: Placement | None = None  # a run's placement (replicas, token-index split); None: `placement`

    def node(self, rank: np.ndarray) -> np.ndarray:
        return rank // self.ranks_per_node

    @property
    def policy(self) -> str:
        return "contiguous" if self.slots is None else self.slots.policy

    def copy_ranks(self, topk_ids: np.ndarray, local_t: np.ndarray, layer: int) -> np.ndarray:
        """topk_ids [T, K] logical, local_t [T] each token's index on its rank → [T*K] owning rank."""
        if self.slots is None:
            return self.placement[topk_ids.reshape(-1)]
        table, counts = replica_table(self.slots, layer)  # [E, max_r], [E]
        choice = local_t[:, None] % counts[topk_ids]  # [T, K]
        return (table[topk_ids, choice] // self.slots.slots_per_rank).reshape(-1)


def replica_table(p: Placement, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """[E, max_r] physical slots of each logical expert (increasing, -1 padded) and [E] replica counts."""
    reps = p.replicas(layer)
    table = np.full((p.num_experts, max(len(r) for r in reps)), -1, dtype=np.int64)
    for e, slots in enumerate(reps):
        table[e, : len(slots)] = slots
    return table, np.array([len(r) for r in reps], dtype=np.int64)


def contiguous_layout(num_experts: int, ep_size: int, ranks_per_node: int) -> EPLayout:
    check_ep(num_experts, ep_size, ranks_per_node=ranks_per_node)
    placement = np.arange(num_experts) // (num_experts // ep_size)  # [E]
    return EPLayout(num_experts, ep_size, ranks_per_node, placement)


def placement_layout(p: Placement | None, num_experts: int, ep_size: int, ranks_per_node: int) -> EPLayout:
    """The layout a run used: its placement when it has one (replicas, another policy), else contiguous."""
    if p is None:
        return contiguous_layout(num_experts, ep_size, ranks_per_node)
    check_ep(num_experts, ep_size, p.redundant, ranks_per_node)
    plain = np.arange(num_experts) * ep_size // num_experts  # [E] a no-replica reference, any E
    return EPLayout(num_experts, ep_size, ranks_per_node, plain, p)


def token_origin(T: int, ep_size: int, origin: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """→ (src [T] rank each token starts on, local_t [T] its index among that rank's tokens)."""
    src = np.arange(T) % ep_size if origin is None else np.asarray(origin, dtype=np.int64)
    local_t = np.zeros(T, dtype=np.int64)
    for r in np.unique(src):
        mine = src == r
        local_t[mine] = np.arange(int(mine.sum()))
    return src, local_t


@dataclass(frozen=True)
class StepTraffic:
    copies_in: np.ndarray  # [R] token copies each rank computes
    send_bytes: np.ndarray  # [R] bytes each rank puts on a link (dispatch out + combine out)
    recv_bytes: np.ndarray  # [R] bytes each rank takes off a link
    same_rank: int  # bytes that stay on their rank (dispatch + combine)
    intra_node: int  # bytes between ranks of one node
    inter_node: int  # bytes between nodes


def step_traffic(topk_ids: np.ndarray, layout: EPLayout, row_bytes: int, origin: np.ndarray | None = None,
                 layer: int = -1) -> StepTraffic:
    """topk_ids: [T, K] one layer's routing in one step; row_bytes = D · dtype bytes; origin [T] the
    rank each token was computed on (None: t % R); layer: the model layer (for a run's placement)."""
    T, K = topk_ids.shape
    R = layout.ep_size
    src_t, local_t = token_origin(T, R, origin)
    src = np.repeat(src_t, K)  # [T*K] origin rank of each copy
    dst = layout.copy_ranks(topk_ids, local_t, layer)  # [T*K] owning rank
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
