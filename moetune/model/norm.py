"""RMSNorm, computed in fp32 like the reference implementations."""

from __future__ import annotations

import torch


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight  # [N]
        self.eps = eps

    def tensors(self) -> list[torch.Tensor]:
        return [self.weight]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)
