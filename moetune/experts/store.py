"""ExpertStore: the routed experts of every MoE layer, stacked per layer.

The MoE layer never touches checkpoint tensors; it asks the store for a layer's weights. Later
work extends the store (precision per expert, offloaded experts with prefetch, replicas mapped to
physical slots) without changing the MoE layer's phases.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moetune.model.naming import TensorNames
from moetune.model.spec import ModelSpec
from moetune.model.weights import WeightSource


@dataclass
class ExpertWeights:
    """One layer's experts. P = physical slots (E when there are no replicas)."""

    w13: torch.Tensor  # [P, 2I, D]  gate rows first, then up rows
    w2: torch.Tensor  # [P, D, I]

    @property
    def num_slots(self) -> int:
        return self.w13.shape[0]

    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in (self.w13, self.w2))


class ExpertStore:
    def __init__(self, layers: dict[int, ExpertWeights]):
        self._layers = layers

    def weights(self, layer: int) -> ExpertWeights:
        return self._layers[layer]

    def layers(self) -> list[int]:
        return sorted(self._layers)

    def nbytes(self) -> int:
        return sum(w.nbytes() for w in self._layers.values())


def load_expert_store(source: WeightSource, spec: ModelSpec) -> ExpertStore:
    names = TensorNames(spec.model_type)
    return ExpertStore({i: _load_layer(source, names, spec, i) for i in spec.moe_layers})


def _load_layer(source: WeightSource, names: TensorNames, spec: ModelSpec, i: int) -> ExpertWeights:
    fused_w13, fused_w2 = names.fused_experts(i)
    if source.has(fused_w13):
        return ExpertWeights(w13=source.get(fused_w13), w2=source.get(fused_w2))
    E, I, D = spec.moe.num_experts, spec.moe.intermediate_size, spec.hidden_size
    w13 = torch.empty(E, 2 * I, D, device=source.device, dtype=source.dtype)
    w2 = torch.empty(E, D, I, device=source.device, dtype=source.dtype)
    for e in range(E):
        w13[e, :I] = source.get(names.expert(i, e, "gate"))  # [I, D]
        w13[e, I:] = source.get(names.expert(i, e, "up"))  # [I, D]
        w2[e] = source.get(names.expert(i, e, "down"))  # [D, I]
    return ExpertWeights(w13=w13, w2=w2)
