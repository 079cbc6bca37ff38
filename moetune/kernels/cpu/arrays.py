"""Small array helpers of the CPU kernels' wrappers and records (torch imported inside each call, so
importing this module costs nothing; it imports no other module of the package, so the records of
the fused layer and the runtime that loads its kernels both use it without a loop)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=64)
def ones(*shape: int):
    """A shared, read-only fp32 tensor of ones (the unit scales of fp32 weights), made once per shape."""
    import torch

    return torch.ones(shape)


def fp32_cpu(*tensors) -> bool:
    """Whether every tensor is fp32 on the CPU (what the numba kernels take)."""
    import torch

    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def numpy_view(t):
    """A CPU tensor as a C-contiguous numpy array: zero-copy when it already is contiguous (one
    check and one call: each torch call costs µs on a decode step's flushed caches)."""
    if t.requires_grad:
        t = t.detach()
    return t.numpy() if t.is_contiguous() else t.contiguous().numpy()
