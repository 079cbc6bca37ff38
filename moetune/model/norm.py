"""RMSNorm, computed in fp32 like the reference implementations."""

from __future__ import annotations

import torch

from moetune.kernels.cpu import records
from moetune.kernels.cpu.rowwise import rms_norm


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float, kernel: bool = False):
        """kernel: fp32 CPU inputs go through the one-call CPU kernel (`kernels/cpu/rowwise.py`),
        which this method is the twin of; the loader sets it with the other CPU decode kernels."""
        self.weight = weight  # [N]
        self.eps = eps
        self.kernel = kernel

    def tensors(self) -> list[torch.Tensor]:
        return [self.weight]

    def kernel_record(self) -> records.Norm:
        """This norm as the fused decode layer's kernels take it (fp32 CPU weight: a view)."""
        return records.norm(self.weight, self.eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel and x.dtype == self.weight.dtype == torch.float32 and x.device.type == "cpu":
            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def kernel_norm(norm: RMSNorm | None) -> records.Norm:
    """`RMSNorm.kernel_record`, or the empty record of a norm a layer does not have."""
    return records.norm() if norm is None else norm.kernel_record()
