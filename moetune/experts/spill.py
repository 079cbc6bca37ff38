"""The host tier of an offload store with a disk tier below it (offload.disk_after N > 0): the host → disk
step of the expert lifecycle (experts/offload.py).

Each non-resident expert's blob (experts/offload.py's layout: its four parts back to back) starts in
host memory. The store calls `demote(e)` for an expert that N consecutive steps of its layer neither
used nor held on the device: its blob is written to `dir/layer{i}-e{e}.blob` and the host copy
dropped. The write is atomic — to `….blob.tmp`, flushed, fsync'd, renamed — so a failure (a full or
read-only disk) leaves no half-written file: the temporary is removed, the blob stays in host memory
and the failure is one `OffloadError` line. A later `read(e, dests)` of a disk expert is a promotion:
one `preadv` of the file into a fresh host blob (pinned on CUDA), its pages dropped from the page
cache, then copied into the device slot as any host read. The file stays as a clean copy (blobs never
change), so demoting the expert again only drops the host copy; `close()` removes the files.

Reads run on the thread that asks: a demand miss on the compute thread, a prefetch on the store's
prefetch thread (asynchronously). Demotion writes run on the compute thread at the start of a step
of the layer (counted in offload_wait). Counters (`counts`): host / disk reads and bytes, disk writes
and bytes written, demotions to disk and promotions from it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from moetune.errors import MoetuneError


class SpillError(MoetuneError):
    """The disk tier cannot take or give back an expert (write failed, file truncated)."""


@dataclass
class SpillCounts:
    reads_host: int = 0
    bytes_host: int = 0
    reads_disk: int = 0
    bytes_disk: int = 0
    writes: int = 0  # blobs written to disk (once per expert: the file stays a clean copy)
    bytes_written: int = 0
    demotions: int = 0  # host copies dropped, the expert on disk only
    promotions: int = 0  # disk-only experts read back into host memory


class SpillingBacking:
    """Host blobs over a directory of per-expert files. `layouts[e]`: expert e's BlobLayout."""

    tier = "host"

    def __init__(self, blobs: list[torch.Tensor], layouts: list, directory: Path, layer: int, pin: bool):
        self.layouts, self.dir, self.layer, self.pin = layouts, directory, layer, pin
        self.blobs: list[torch.Tensor | None] = [b.pin_memory() if pin else b for b in blobs]  # None: on disk only
        self.written: set[int] = set()  # experts with a complete file
        self.counts = SpillCounts()
        self._count_lock = threading.Lock()  # reads run on the compute and the prefetch thread

    def path(self, e: int) -> Path:
        return self.dir / f"layer{self.layer}-e{e}.blob"

    def at_host(self, e: int) -> bool:
        return self.blobs[e] is not None

    def on_disk(self) -> int:
        return sum(b is None for b in self.blobs)

    def demote(self, e: int) -> None:
        """Expert e to disk only: write its file (once, atomically), then drop the host copy."""
        blob = self.blobs[e]
        if blob is None:
            return
        if e not in self.written:
            self._write(e, blob)
        self.blobs[e] = None
        self.counts.demotions += 1

    def _write(self, e: int, blob: torch.Tensor) -> None:
        final = self.path(e)
        tmp = final.with_name(final.name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(memoryview(blob.numpy()))
                fh.flush()
                os.fsync(fh.fileno())
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SpillError(f"offload disk tier: cannot write expert {e} of layer {self.layer} to '{final}' "
                             f"({exc.strerror or exc}); give a writable directory with free space in offload.dir, "
                             "or set offload.disk_after 0") from None
        self.written.add(e)
        self.counts.writes += 1
        self.counts.bytes_written += blob.numel()

    def read(self, e: int, dests: list[torch.Tensor], stream=None) -> str:
        """Fill one slot's part tensors with expert e (promoting it from disk first); the tier read."""
        tier = "host"
        if self.blobs[e] is None:
            self.blobs[e] = self._promote(e)
            tier = "disk"
        else:
            with self._count_lock:
                self.counts.reads_host += 1
                self.counts.bytes_host += self.layouts[e].nbytes
        blob = self.blobs[e]
        for (_, _, _, start, end), dst in zip(self.layouts[e].parts, dests):
            dst.view(-1).view(torch.uint8).copy_(blob[start:end], non_blocking=stream is not None)
        return tier

    def _promote(self, e: int) -> torch.Tensor:
        n = self.layouts[e].nbytes
        blob = torch.empty(n, dtype=torch.uint8)  # [nbytes]
        fd = os.open(self.path(e), os.O_RDONLY)
        try:
            got = os.preadv(fd, [memoryview(blob.numpy())], 0)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if got != n:
            raise SpillError(f"offload disk tier: '{self.path(e)}' is truncated ({got} of {n} bytes)")
        with self._count_lock:
            self.counts.reads_disk += 1
            self.counts.bytes_disk += n
            self.counts.promotions += 1
        return blob.pin_memory() if self.pin else blob

    def close(self) -> None:
        for e in sorted(self.written):
            self.path(e).unlink(missing_ok=True)
        self.written = set()
        self.blobs = []
