"""Dense gated MLP (dense layers and shared experts): down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class GatedMLP:
    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
        self.w13 = torch.cat([gate, up], dim=0)  # [2I, D]
        self.w2 = down  # [D, I]
        self.intermediate = gate.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, D]
        h = x @ self.w13.t()  # [T, 2I]
        h = F.silu(h[:, : self.intermediate]) * h[:, self.intermediate :]  # [T, I]
        return h @ self.w2.t()  # [T, D]

    def tensors(self) -> list[torch.Tensor]:
        return [self.w13, self.w2]
