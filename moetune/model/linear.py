"""Projections: y = x @ W.T (+ b), through the CPU decode kernel when only a few rows share W.

A decode step multiplies a few rows by every weight once, so its time is the weight bytes over the
memory bandwidth; torch's small-M sgemm reads W at about half that rate on the CPU, while
`moetune.kernels.cpu.linear` reads W once for up to ~16 rows at the read limit. The loader turns the
kernel on (`small_m`) for fp32 models on the CPU under the `cpu` kernel backend; every other case,
and steps with more rows (prefill), take `F.linear`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moetune.kernels.cpu import linear as cpu_linear

SMALL_M = 16  # rows up to which the CPU kernel runs when it is on


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, small_m: int = 0) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias [N]) → [M, N]: the CPU kernel when 0 < M ≤ small_m."""
    if 0 < x.shape[0] <= small_m:
        y = cpu_linear(x, weight)  # [M, N]
        return y if bias is None else y.add_(bias)
    return F.linear(x, weight, bias)


@dataclass
class Linear:
    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None = None
    small_m: int = 0  # rows up to which the CPU kernel runs (0: always F.linear)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return project(x, self.weight, self.bias, self.small_m)

    def tensors(self) -> list[torch.Tensor]:
        return [self.weight] + ([self.bias] if self.bias is not None else [])

    @classmethod
    def fused(cls, parts: list["Linear"], small_m: int = 0) -> "Linear":
        """One projection whose output is the parts' outputs side by side (one read of x, one call)."""
        weight = torch.cat([p.weight for p in parts])  # [Σ out, in]
        bias = None
        if any(p.bias is not None for p in parts):
            bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in parts])
        return cls(weight, bias, small_m)
