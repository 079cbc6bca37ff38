"""Dense gated MLP (dense layers and shared experts): down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moetune.model.linear import Weight, cat_weights, out_features, project, weight_tensors


class GatedMLP:
    def __init__(self, gate: Weight, up: Weight, down: Weight, small_m: int = 0):
        """Weights float tensors or packed (`model/linear.py`)."""
        self.w13 = cat_weights([gate, up])  # [2I, D]
        self.w2 = down  # [D, I]
        self.intermediate = out_features(gate)
        self.small_m = small_m  # rows up to which the CPU decode kernel runs (see model/linear.py)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, D]
        h = project(x, self.w13, small_m=self.small_m)  # [T, 2I]
        h = F.silu(h[:, : self.intermediate]) * h[:, self.intermediate :]  # [T, I]
        return project(h, self.w2, small_m=self.small_m)  # [T, D]

    def tensors(self) -> list[torch.Tensor]:
        return weight_tensors(self.w13) + weight_tensors(self.w2)
