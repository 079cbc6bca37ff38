"""ExpertStore: where the routed experts' weights live, and the MoE layer's one way to reach them.

The MoE layer never touches checkpoint tensors. After routing it calls
`store.acquire(layer, topk_ids)` (inside the `offload_wait` phase) and receives that layer's
`ExpertWeights`; then `store.prefetch(layer, topk_ids, hidden)` lets a store that offloads experts start
loading what the next layers will likely need, and `store.hint(layer, experts)` (before a step) what
the step's sequences' routing history predicts. The resident store here holds every expert on the
compute device, so both return at once. Stores that quantize per expert, offload to host or disk,
or hold hot-expert replicas implement the same two calls.

P = physical expert slots of a layer: E logical experts plus replicas. The slot map turns the
router's logical ids into physical slots; without replicas it is the identity (and free).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from moetune.kernels.quant_formats import PackedWeight, plain
from moetune.tensors import nbytes as tensor_bytes


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
class FormatGroup:
    """Physical slots [start, stop) of one layer that share one weight format, stacked:
    w13 [stop - start, 2I, D], w2 [stop - start, D, I]; local index = slot - start."""

    start: int
    stop: int
    w13: PackedWeight
    w2: PackedWeight

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ExpertWeights:
    """One layer's routed experts over physical slots, as format groups.

    The contract every experts-phase backend follows:
      - `groups` partition the P slots into contiguous ranges [start, stop), one weight format
        each (a PackedWeight holds one format). A layer in one format has one group, and then
        `w13` [P, 2I, D] / `w2` [P, D, I] are that group's weights; a mixed layer has `w13 = w2 = None`.
      - rows are sorted by physical slot (permute), so group g's rows are the one contiguous range
        x[offsets[g.start] : offsets[g.stop]] and its segment offsets are
        offsets[g.start : g.stop + 1] - offsets[g.start]: run any grouped kernel on that slice.
        (Kernels that must not read offsets back to the host can instead map slots outside the
        group to -1, as the triton backend does.)
    A mixed layer is built with its slots sorted by format (`experts.mixed.quantized_layer`): the
    slot map sends each logical expert to its place in that order.
    """

    w13: PackedWeight | None
    w2: PackedWeight | None
    slots: SlotMap
    groups: tuple[FormatGroup, ...] = ()

    def __post_init__(self):
        if not self.groups:
            object.__setattr__(self, "groups", (FormatGroup(0, self.w13.num_experts, self.w13, self.w2),))
        elif self.w13 is None and len(self.groups) == 1:
            object.__setattr__(self, "w13", self.groups[0].w13)
            object.__setattr__(self, "w2", self.groups[0].w2)

    @classmethod
    def dense(cls, w13: torch.Tensor, w2: torch.Tensor) -> "ExpertWeights":
        """Plain tensors, one slot per logical expert."""
        return cls(plain(w13), plain(w2), SlotMap(w13.shape[0]))

    @classmethod
    def from_groups(cls, groups: list[FormatGroup], slots: SlotMap) -> "ExpertWeights":
        return cls(None, None, slots, tuple(groups))

    @property
    def mixed(self) -> bool:
        return len(self.groups) > 1

    def slot_weights(self, slot: int) -> tuple[PackedWeight, PackedWeight, int]:
        """(w13, w2, index in them) of one physical slot."""
        for g in self.groups:
            if g.start <= slot < g.stop:
                return g.w13, g.w2, slot - g.start
        raise IndexError(f"slot {slot} outside 0..{self.num_slots - 1}")

    @property
    def num_slots(self) -> int:  # slots held here (all P on one rank; this rank's share under EP)
        return self.groups[-1].stop

    @property
    def intermediate_size(self) -> int:  # I
        return self.groups[0].w2.in_features

    @property
    def hidden_size(self) -> int:  # D
        return self.groups[0].w13.in_features

    def tensors(self) -> list[torch.Tensor]:
        return [t for g in self.groups for w in (g.w13, g.w2) for t in (w.data, w.scale) if t is not None]

    def nbytes(self) -> int:
        return tensor_bytes(self.tensors())


class ExpertStore(Protocol):
    """Every call the engine, the loader, the fused decode step and the profiler make on a store; each
    store implements all of them (a store with nothing to do makes them no-ops)."""

    resident: bool  # acquire hands out the same weights whatever the ids, and prefetch does nothing
    settings: Any  # the store's settings record for the run dir (OffloadSettings), None without any

    def acquire(self, layer: int, topk_ids: torch.Tensor) -> ExpertWeights:
        """The layer's experts, with every expert in `topk_ids` [T, K] ready to compute."""
        ...

    def prefetch(self, layer: int, topk_ids: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        """Called once `layer` is routed, with the layer's input `hidden` [T, D]: a store may start
        loading what later layers will need (e.g. by applying their gates to `hidden`)."""
        ...

    wants_hints: bool  # whether `hint` does anything (the engine keeps expert traces for it only then)

    def hint(self, layer: int, experts: list[int]) -> None:
        """Before a step: experts of `layer` that the step's sequences' history predicts (their
        recent tokens' routing, engine/expert_trace.py); a store that prefetches may start loading them."""
        ...

    def layers(self) -> list[int]: ...

    def nbytes(self) -> int: ...

    def bind_routers(self, routers: dict[int, Callable[[torch.Tensor], torch.Tensor]]) -> None:
        """Each MoE layer's router (hidden [T, D] → topk_ids [T, K]), given once by the loader: a store
        that prefetches predicts later layers' experts with them."""
        ...

    def stats(self) -> dict[int, dict]:
        """Per MoE layer, the store's counters (hits, misses, bytes fetched, ...); {} when it keeps none."""
        ...

    def reset_stats(self) -> None:
        """Zero the counters (the profiler counts measured steps only)."""
        ...

    def drain(self) -> None:
        """Return once nothing is loading in the background."""
        ...


class ResidentExpertStore:
    """Every expert of every MoE layer resident on the compute device: nothing to load, predict or count."""

    resident = True
    settings = None
    wants_hints = False

    def __init__(self, layers: dict[int, ExpertWeights]):
        self._layers = layers

    def acquire(self, layer: int, topk_ids: torch.Tensor) -> ExpertWeights:
        return self._layers[layer]

    def prefetch(self, layer: int, topk_ids: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        return None

    def hint(self, layer: int, experts: list[int]) -> None:
        return None

    def layers(self) -> list[int]:
        return sorted(self._layers)

    def bind_routers(self, routers: dict[int, Callable[[torch.Tensor], torch.Tensor]]) -> None:
        return None

    def stats(self) -> dict[int, dict]:
        return {}

    def reset_stats(self) -> None:
        return None

    def drain(self) -> None:
        return None

    def weights(self, layer: int) -> ExpertWeights:
        """Direct access for tools that read weights outside a forward pass (kernel tuning, tests)."""
        return self._layers[layer]

    def nbytes(self) -> int:
        return sum(w.nbytes() for w in self._layers.values())

    def tensors(self) -> list[torch.Tensor]:
        """Every resident expert tensor (data and scales)."""
        return [t for w in self._layers.values() for t in w.tensors()]
