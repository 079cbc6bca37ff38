"""StepRouting: which experts each engine step woke, and which each scheduled sequence's last token chose.

Each MoE layer's `tap` (moe/layer.py, and the fused CPU decode layer at the same seam) hands this
record the layer's top-k ids [T, K] of the step. After the step the engine asks `finish(rows)` for
  - the step's distinct experts: Σ over MoE layers of the distinct experts routed to (what a step
    reads or fetches; the figure expert-affinity scheduling lowers), and
  - per scheduled entry, the experts its last token chose in every MoE layer, as one frozenset of
    keys layer_row · E + expert (the prediction of its next decode step: engine/affinity.py);
  - every token's ids [T, Lm, K] (the per-sequence traces beside the KV blocks: engine/expert_trace.py).
Only the rows that were taps' inputs are read: one host copy of [T, Lm, K] per step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class StepExperts(NamedTuple):
    distinct: int  # Σ_layers distinct experts woken in the step
    last: list[frozenset[int]]  # per entry: keys layer_row · E + expert of its last token
    ids: torch.Tensor | None = None  # [T, Lm, K] expert ids of every token, when every MoE layer was heard


class StepRouting:
    def __init__(self, model):
        from moetune.moe.layer import MoELayer

        self.mlps = [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoELayer)]
        self.row = {mlp.layer: j for j, mlp in enumerate(self.mlps)}  # model layer → MoE row
        self.num_experts = model.spec.moe.num_experts if self.mlps else 0
        self._ids: list[torch.Tensor | None] = [None] * len(self.mlps)
        self._previous: list = []

    def attach(self) -> None:
        """Become the layers' tap; `detach` gives the taps back to whoever held them (nested records)."""
        self._previous = [mlp.tap for mlp in self.mlps]
        for mlp in self.mlps:
            mlp.tap = self._hear

    def detach(self) -> None:
        for mlp, previous in zip(self.mlps, self._previous):
            mlp.tap = previous

    def _hear(self, layer: int, topk_ids: torch.Tensor) -> None:
        self._ids[self.row[layer]] = topk_ids

    def begin(self) -> None:
        self._ids = [None] * len(self.mlps)

    def finish(self, rows: list[int]) -> StepExperts:
        """rows: tokens of each entry of the step, in batch order (sum = T)."""
        heard = [(j, ids) for j, ids in enumerate(self._ids) if ids is not None and ids.shape[0] == sum(rows)]
        if not heard or not rows:
            return StepExperts(0, [frozenset()] * len(rows))
        E = self.num_experts
        keys = torch.stack([ids.to("cpu", torch.int64) + j * E for j, ids in heard], dim=1)  # [T, Lm', K]
        distinct = int(torch.unique(keys).numel())
        last_rows = torch.cumsum(torch.tensor(rows), 0) - 1  # [B] each entry's last token
        last = keys.index_select(0, last_rows).reshape(len(rows), -1).tolist()  # [B, Lm'·K]
        ids = keys - torch.arange(len(heard))[None, :, None] * E if len(heard) == len(self.mlps) else None
        return StepExperts(distinct, [frozenset(k) for k in last], ids)
