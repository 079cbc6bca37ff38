"""Weights in transparent huge pages (CPU).

A decode step streams every weight once, and on x86 a stream through 4 KiB pages misses the TLB
every 4 KiB: measured on this project's 2-core AVX2 machine, the CPU GEMV kernel read a
[32000, 768] fp32 weight at 24 GB/s from torch-allocated memory and at 31–33 GB/s from memory in
2 MiB pages (same process, same kernel; docs/cpu.md). Linux gives an anonymous private mapping huge
pages when it is advised `MADV_HUGEPAGE` (the usual `transparent_hugepage=madvise` setting);
torch's allocator never advises, so `to_huge_pages` moves a model's weights into one such arena
after loading: each distinct storage is copied once, and every tensor that uses it is re-pointed in
place (`Tensor.set_`), so the objects that hold the tensors need not know.

Where the kernel does not grant huge pages (THP `never`, no memory to compact) the arena is plain
memory and nothing changes but one copy at load.
"""

from __future__ import annotations

import mmap

import torch

ALIGN = 64  # bytes: every storage in the arena starts on a cache line


def to_huge_pages(tensors: list[torch.Tensor]) -> int:
    """Move the CPU storages behind `tensors` into one huge-page arena; returns the bytes moved
    (0 when nothing was on the CPU or the platform has no MADV_HUGEPAGE)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0
    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        if t.device.type == "cpu" and t.numel():
            by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    if not by_storage:
        return 0
    sizes = {ptr: ts[0].untyped_storage().nbytes() for ptr, ts in by_storage.items()}
    total = sum(_aligned(n) for n in sizes.values())
    arena = _arena(total)  # [total] uint8
    offset = 0
    for ptr, group in by_storage.items():
        n = sizes[ptr]
        old = group[0].untyped_storage()
        arena[offset : offset + n].copy_(torch.empty(0, dtype=torch.uint8).set_(old))
        for t in _unique(group):
            size = t.element_size()
            t.set_(arena.untyped_storage(), (offset // size) + t.storage_offset(), t.shape, t.stride())
        offset += _aligned(n)
    return total


def huge_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in memory advised MADV_HUGEPAGE (pages are committed as they are
    first written, like `torch.empty`); plain `torch.empty` where the platform cannot advise."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    n = torch.Size(shape).numel()
    return _arena(n * torch.empty((), dtype=dtype).element_size()).view(dtype)[:n].view(shape)


def _arena(nbytes: int) -> torch.Tensor:
    """Anonymous private memory advised MADV_HUGEPAGE, as a uint8 tensor that keeps it alive."""
    buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buf, dtype=torch.uint8)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out
