"""Where an offloaded layer's non-resident experts live: each expert one contiguous blob, its four parts
back to back (w13 data | w13 scales | w2 data | w2 scales: `BlobLayout`, one per weight format), in
(pinned) host memory (`HostBacking`) or a safetensors file per layer read with `os.preadv` at the
header's offsets, never mmap, with `posix_fadvise(DONTNEED)` after each read (`DiskBacking`).
`read(e, dests)` fills the part tensors of one cache slot and names the tier it read."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from moetune.experts.offload_config import OffloadError
from moetune.experts.store import FormatGroup
from moetune.kernels.quant_formats import PackedWeight


@dataclass(frozen=True)
class BlobLayout:
    """Byte ranges of an expert's four parts inside its blob, and their dtypes/shapes."""

    parts: tuple[tuple[str, torch.dtype, tuple[int, ...], int, int], ...]  # (name, dtype, shape, start, end)
    nbytes: int

    @classmethod
    def of(cls, w13: PackedWeight, w2: PackedWeight) -> "BlobLayout":
        parts, at = [], 0
        for name, t in part_tensors(w13, w2):
            n = t[0].nbytes
            parts.append((name, t.dtype, tuple(t.shape[1:]), at, at + n))
            at += n
        return cls(tuple(parts), at)


def part_tensors(w13: PackedWeight, w2: PackedWeight) -> list[tuple[str, torch.Tensor]]:
    out = [("w13", w13.data), ("w13_scale", w13.scale), ("w2", w2.data), ("w2_scale", w2.scale)]
    return [(n, t) for n, t in out if t is not None]


def expert_blob(group: FormatGroup, index: int) -> torch.Tensor:
    """The parts of slot `index` of a format group as one contiguous uint8 blob on the CPU."""
    return torch.cat([t[index].detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                      for _, t in part_tensors(group.w13, group.w2)])


class HostBacking:
    """Where a layer's non-resident experts live; `read(e, dests)` fills the part tensors of one slot.
    `layouts[e]`: expert e's blob layout (its format's)."""

    tier = "host"

    def __init__(self, blobs: list[torch.Tensor], layouts: list[BlobLayout], pin: bool):
        self.layouts = layouts
        self.blobs = [b.pin_memory() if pin else b for b in blobs]

    def read(self, e: int, dests: list[torch.Tensor], stream=None) -> str:
        blob = self.blobs[e]
        for (_, _, _, start, end), dst in zip(self.layouts[e].parts, dests):
            dst.view(-1).view(torch.uint8).copy_(blob[start:end], non_blocking=stream is not None)
        return self.tier

    def close(self) -> None:
        self.blobs = []


class DiskBacking(HostBacking):
    """One safetensors file per layer; reads with preadv at the header offsets, pages dropped after."""

    tier = "disk"

    def __init__(self, blobs: list[torch.Tensor], layouts: list[BlobLayout], path: Path, device: torch.device):
        from safetensors.torch import save_file

        self.layouts, self.path, self.device = layouts, path, device
        save_file({f"e{e}": b for e, b in enumerate(blobs)}, str(path))
        self.fd = os.open(path, os.O_RDONLY)
        os.fsync(self.fd)
        drop_pages(self.fd, 0, 0)
        self.offsets = blob_offsets(path, len(blobs))  # [E] absolute file offset of each blob
        largest = max(x.nbytes for x in layouts)
        self.staging = None if device.type == "cpu" else torch.empty(largest, dtype=torch.uint8).pin_memory()

    def read(self, e: int, dests: list[torch.Tensor], stream=None) -> str:
        offset, layout = self.offsets[e], self.layouts[e]
        if self.staging is None:  # straight into the resident tensors: one syscall, no extra copy
            views = [memoryview(d.view(-1).view(torch.uint8).numpy()) for d in dests]
            got = os.preadv(self.fd, views, offset)
        else:
            got = os.preadv(self.fd, [memoryview(self.staging[:layout.nbytes].numpy())], offset)
            for (_, _, _, start, end), dst in zip(layout.parts, dests):
                dst.view(-1).view(torch.uint8).copy_(self.staging[start:end], non_blocking=stream is not None)
            if stream is not None:
                stream.synchronize()  # the staging buffer is reused by the next read
        if got != layout.nbytes:
            raise OffloadError(f"offload file '{self.path}' is truncated (expert {e}: {got} of "
                               f"{layout.nbytes} bytes)")
        drop_pages(self.fd, offset, layout.nbytes)
        return self.tier

    def close(self) -> None:
        if self.fd >= 0:  # idempotent: a second close must not hit a descriptor number reused since
            os.close(self.fd)
            self.fd = -1


def drop_pages(fd: int, offset: int, length: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def blob_offsets(path: Path, n: int) -> list[int]:
    with open(path, "rb") as fh:
        size = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(size))
    return [8 + size + header[f"e{e}"]["data_offsets"][0] for e in range(n)]
