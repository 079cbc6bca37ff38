"""Row-wise ops of a step on CPU: RMSNorm and the rotary embedding, one numba call each.

  rms_norm(x [..., D], w [D], eps) → [..., D]          w · x / sqrt(mean(x²) + eps), in fp32
  rope_(x [T, H, R], cos [T, R], sin [T, R])          x·cos + rotate_half(x)·sin, in place

Each replaces a handful of torch ops (pow, mean, rsqrt, mul... or slice, cat, neg, mul, add).
Those cost little on warm caches, but in a decode step every op runs right after a kernel that
streamed megabytes of weights through the caches, and each then costs tens of µs (docs/cpu.md).
One thread: the rows of a step are few. Twins: `moetune.model.norm.RMSNorm` and
`moetune.model.rope.Rotary.apply` (tests compare them).
"""

from __future__ import annotations

import torch

from moetune.kernels.cpu.runtime import fp32_cpu, jit


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] fp32, w [D] fp32 → a new [..., D] tensor."""
    if not fp32_cpu(x, w) or w.dim() != 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"rms_norm takes fp32 CPU x [..., D] and w [D]; got {tuple(x.shape)}, {tuple(w.shape)}")
    x2 = x.reshape(-1, x.shape[-1])  # [T, D] (a view when the rows are evenly strided)
    out = torch.empty(x2.shape, dtype=torch.float32)  # [T, D]
    jit().rms_norm(x2.numpy(), w.contiguous().numpy(), float(eps), out.numpy())
    return out.view(x.shape)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, R] fp32 (a view is fine) rotated in place with cos, sin [T, R]; returns x."""
    if not fp32_cpu(x, cos, sin) or x.dim() != 3 or cos.shape != (x.shape[0], x.shape[2]) \
            or sin.shape != cos.shape or x.shape[2] % 2:
        raise ValueError(f"rope_ takes fp32 CPU x [T, H, R] (R even) and cos, sin [T, R]; got "
                         f"{tuple(x.shape)}, {tuple(cos.shape)}, {tuple(sin.shape)}")
    jit().rope_rotate_half(x.numpy(), cos.contiguous().numpy(), sin.contiguous().numpy())
    return x
