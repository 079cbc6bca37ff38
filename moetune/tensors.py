"""Counting the memory behind tensors: each byte once, whether tensors are views of one another, tied
(the same tensor twice) or carved from one arena (`model/hugepages.py`)."""

from __future__ import annotations

import torch


def span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) byte addresses of the elements `t` covers (strides included)."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def distinct(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The first tensor of each distinct memory span (a tied or repeated weight once)."""
    seen, out = set(), []
    for t in tensors:
        key = (t.device, span(t))
        if t.numel() and key not in seen:
            seen.add(key)
            out.append(t)
    return out


def nbytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of memory behind `tensors`, overlapping spans merged."""
    spans = sorted((str(t.device), *span(t)) for t in tensors if t.numel())
    total, device, end = 0, None, -1
    for dev, lo, hi in spans:
        if dev != device or lo >= end:
            total += hi - lo
            device, end = dev, hi
        elif hi > end:
            total += hi - end
            end = hi
    return total
