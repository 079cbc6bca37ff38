"""ExpertStore: where the routed experts' weights live, and the MoE layer's one way to reach them.

The MoE layer never touches checkpoint tensors. After routing it calls
`store.acquire(layer, topk_ids)` (inside the `offload_wait` phase) and receives that layer's
`ExpertWeights`; then `store.prefetch(layer, topk_ids)` lets a store that offloads experts start
loading what the next layers will likely need. The resident store here holds every expert on the
compute device, so both return at once. Stores that quantize per expert, offload to host or disk,
or hold hot-expert replicas implement the same two calls.

P = physical expert slots of a layer: E logical experts plus replicas. The slot map turns the
router's logical ids into physical slots; without replicas it is the identity (and free).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from moetune.kernels.quant_formats import PackedWeight, plain


@dataclass(frozen=True)
class SlotMap:
    """Logical expert → physical slots. Copies of a replicated expert are spread over its replicas
    by token index: token t's copy goes to replica t mod (replicas of that expert)."""

    num_experts: int  # E
    num_slots: int = 0  # P over all ranks (0: E, no replicas)
    replicas: torch.Tensor | None = None  # [E, max_r] int64 physical slot per replica, -1 = none
    counts: torch.Tensor | None = None  # [E] int64 replicas per logical expert

    def __post_init__(self):
        if not self.num_slots:
            object.__setattr__(self, "num_slots", self.num_experts)

    @property
    def identity(self) -> bool:
        return self.replicas is None

    def physical(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """topk_ids [T, K] logical → [T, K] physical slots."""
        if self.replicas is None:
            return topk_ids
        t = torch.arange(topk_ids.shape[0], device=topk_ids.device)[:, None]  # [T, 1]
        choice = t % self.counts[topk_ids]  # [T, K]
        return self.replicas[topk_ids, choice]


@dataclass(frozen=True)
class ExpertWeights:
    """One layer's routed experts, stacked over physical slots: w13 [P, 2I, D] (gate rows, then up
    rows) and w2 [P, D, I], each a packed weight (format + data + scales; plain formats today)."""

    w13: PackedWeight
    w2: PackedWeight
    slots: SlotMap

    @classmethod
    def dense(cls, w13: torch.Tensor, w2: torch.Tensor) -> "ExpertWeights":
        """Plain tensors, one slot per logical expert."""
        return cls(plain(w13), plain(w2), SlotMap(w13.shape[0]))

    @property
    def num_slots(self) -> int:  # slots held here (all P on one rank; this rank's share under EP)
        return self.w13.num_experts

    @property
    def intermediate_size(self) -> int:  # I
        return self.w2.in_features

    @property
    def hidden_size(self) -> int:  # D
        return self.w13.in_features

    def tensors(self) -> list[torch.Tensor]:
        return [t for w in (self.w13, self.w2) for t in (w.data, w.scale) if t is not None]

    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.tensors())


class ExpertStore(Protocol):
    def acquire(self, layer: int, topk_ids: torch.Tensor) -> ExpertWeights:
        """The layer's experts, with every expert in `topk_ids` [T, K] ready to compute."""
        ...

    def prefetch(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Called once `layer` is routed: a store may start loading what later layers will need."""
        ...

    def layers(self) -> list[int]: ...

    def nbytes(self) -> int: ...


class ResidentExpertStore:
    """Every expert of every MoE layer resident on the compute device."""

    def __init__(self, layers: dict[int, ExpertWeights]):
        self._layers = layers

    def acquire(self, layer: int, topk_ids: torch.Tensor) -> ExpertWeights:
        return self._layers[layer]

    def prefetch(self, layer: int, topk_ids: torch.Tensor) -> None:
        return None

    def layers(self) -> list[int]:
        return sorted(self._layers)

    def weights(self, layer: int) -> ExpertWeights:
        """Direct access for tools that read weights outside a forward pass (kernel tuning, tests)."""
        return self._layers[layer]

    def nbytes(self) -> int:
        return sum(w.nbytes() for w in self._layers.values())
