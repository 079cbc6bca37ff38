"""OffloadingExpertStore: only `capacity` experts per MoE layer resident; the rest fetched on demand
from host memory or disk, with eviction (LRU / LFU / score) and prefetch of the next layers' experts.

Layout. Each expert is one contiguous blob in its backing tier, its four parts back to back:
w13 data | w13 scales | w2 data | w2 scales (`ExpertBlob`). Per layer the resident cache is four
contiguous stacked tensors over C slots (w13 [C, 2I, D], ...), so every kernel backend reads it
like any other `ExpertWeights`; a fetch is one read of the blob, scattered into slot s of the four
tensors (disk: one `preadv` straight into them; host: four slice copies, non-blocking from pinned
memory on CUDA).

Tiers. `host`: blobs in (pinned, on CUDA) host memory. `disk`: one safetensors file per layer
written at start (tensor `e{expert}` = the blob), read back with `os.preadv` at the header's
offsets — never mmap — and `posix_fadvise(DONTNEED)` after each read and after writing, so every
fetch really goes to the device instead of the page cache (what `moetune bench` numbers from disk
mean).

Acquire(layer, topk_ids): the distinct experts of the step must be resident. Hits cost nothing; an
expert a prefetch is loading is waited for; the rest are demand fetches, run at once on the calling
thread (never queued behind speculative work), evicting the policy's victim among the slots not
needed this step. Queued speculative fetches for this layer are dropped (demand replaced them).
A step needing more distinct experts than C gets a transient buffer of exactly those experts
(resident ones copied, others fetched; the cache keeps its contents).

Prefetch(layer, topk_ids, hidden), depth d: the routers of the next d MoE layers are applied to
this layer's input `hidden` (`bind_routers`), and their predicted experts queued for a background
thread (on CUDA it copies on its own stream). The thread never evicts an expert of the layer being
computed that this step uses.

Eviction among a layer's slots (never a slot the step needs):
  lru    least recently used        lfu    least often used (ties: least recent)
  score  lowest 0.5·recency + 0.3·frequency + 0.2·prediction, each in [0, 1]: recency = 1/(1+age in
         steps of this layer), frequency = uses / max uses, prediction = 1/d when the latest prefetch
         from d layers back predicted the expert (0 otherwise: nearer predictions weigh more)

Stats per layer (`stats()`): hits, misses (demand fetches), prefetches issued / used before eviction,
prefetch hits (a needed expert found resident or loading because of a prefetch), bytes fetched per
tier, offload_wait seconds, resident bytes. Offloading never changes the numbers computed: slots hold
bit-identical copies, and each expert's rows are the same segment under any slot numbering.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from moetune.errors import MoetuneError
from moetune.experts.store import ExpertWeights, SlotMap
from moetune.kernels.quant_formats import PackedWeight

POLICIES = ("lru", "lfu", "score")
TIERS = ("host", "disk")


class OffloadError(MoetuneError):
    """Offload settings that cannot work (capacity, directory, formats)."""


@dataclass(frozen=True)
class OffloadSettings:
    capacity: int  # resident experts per MoE layer
    policy: str = "lru"
    tier: str = "host"
    dir: str | None = None  # disk tier; None = a temporary directory removed by close()
    prefetch_depth: int = 1


@dataclass
class LayerStats:
    hits: int = 0
    misses: int = 0
    prefetch_issued: int = 0  # speculative fetches completed
    prefetch_used: int = 0  # of those, used by a step before eviction
    prefetch_hits: int = 0  # needed experts resident/loading thanks to a prefetch
    bytes_host: int = 0
    bytes_disk: int = 0
    wait_s: float = 0.0
    overflow_steps: int = 0

    def row(self) -> dict:
        looked = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / looked if looked else 1.0,
                "prefetch_issued": self.prefetch_issued, "prefetch_used": self.prefetch_used,
                "prefetch_precision": self.prefetch_used / self.prefetch_issued if self.prefetch_issued else None,
                "prefetch_recall": (self.prefetch_hits / (self.prefetch_hits + self.misses)
                                    if self.prefetch_hits + self.misses else None),
                "bytes_host": self.bytes_host, "bytes_disk": self.bytes_disk, "offload_wait_s": self.wait_s,
                "overflow_steps": self.overflow_steps}


@dataclass(frozen=True)
class BlobLayout:
    """Byte ranges of an expert's four parts inside its blob, and their dtypes/shapes."""

    parts: tuple[tuple[str, torch.dtype, tuple[int, ...], int, int], ...]  # (name, dtype, shape, start, end)
    nbytes: int

    @classmethod
    def of(cls, w: ExpertWeights) -> "BlobLayout":
        parts, at = [], 0
        for name, t in _part_tensors(w.w13, w.w2):
            n = t[0].nbytes
            parts.append((name, t.dtype, tuple(t.shape[1:]), at, at + n))
            at += n
        return cls(tuple(parts), at)


def _part_tensors(w13: PackedWeight, w2: PackedWeight) -> list[tuple[str, torch.Tensor]]:
    out = [("w13", w13.data), ("w13_scale", w13.scale), ("w2", w2.data), ("w2_scale", w2.scale)]
    return [(n, t) for n, t in out if t is not None]


def _blob(w: ExpertWeights, e: int) -> torch.Tensor:
    """Expert e's parts as one contiguous uint8 blob on the CPU."""
    return torch.cat([t[e].detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                      for _, t in _part_tensors(w.w13, w.w2)])


class _Backing:
    """Where a layer's non-resident experts live; `read(e, dests)` fills the part tensors of one slot."""

    tier = "host"

    def __init__(self, blobs: list[torch.Tensor], layout: BlobLayout, pin: bool):
        self.layout = layout
        self.blobs = [b.pin_memory() if pin else b for b in blobs]

    def read(self, e: int, dests: list[torch.Tensor], stream=None) -> None:
        blob = self.blobs[e]
        for (_, _, _, start, end), dst in zip(self.layout.parts, dests):
            dst.view(-1).view(torch.uint8).copy_(blob[start:end], non_blocking=stream is not None)

    def close(self) -> None:
        self.blobs = []


class _DiskBacking(_Backing):
    """One safetensors file per layer; reads with preadv at the header offsets, pages dropped after."""

    tier = "disk"

    def __init__(self, blobs: list[torch.Tensor], layout: BlobLayout, path: Path, device: torch.device):
        from safetensors.torch import save_file

        self.layout, self.path, self.device = layout, path, device
        save_file({f"e{e}": b for e, b in enumerate(blobs)}, str(path))
        self.fd = os.open(path, os.O_RDONLY)
        os.fsync(self.fd)
        _drop_pages(self.fd, 0, 0)
        self.offsets = _blob_offsets(path, len(blobs))  # [E] absolute file offset of each blob
        self.staging = None if device.type == "cpu" else torch.empty(layout.nbytes, dtype=torch.uint8).pin_memory()

    def read(self, e: int, dests: list[torch.Tensor], stream=None) -> None:
        offset = self.offsets[e]
        if self.staging is None:  # straight into the resident tensors: one syscall, no extra copy
            views = [memoryview(d.view(-1).view(torch.uint8).numpy()) for d in dests]
            got = os.preadv(self.fd, views, offset)
        else:
            got = os.preadv(self.fd, [memoryview(self.staging.numpy())], offset)
            for (_, _, _, start, end), dst in zip(self.layout.parts, dests):
                dst.view(-1).view(torch.uint8).copy_(self.staging[start:end], non_blocking=stream is not None)
            if stream is not None:
                stream.synchronize()  # the staging buffer is reused by the next read
        if got != self.layout.nbytes:
            raise OffloadError(f"offload file '{self.path}' is truncated (expert {e}: {got} of "
                               f"{self.layout.nbytes} bytes)")
        _drop_pages(self.fd, offset, self.layout.nbytes)

    def close(self) -> None:
        if self.fd >= 0:  # idempotent: a second close must not hit a descriptor number reused since
            os.close(self.fd)
            self.fd = -1


def _drop_pages(fd: int, offset: int, length: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _blob_offsets(path: Path, n: int) -> list[int]:
    with open(path, "rb") as fh:
        size = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(size))
    return [8 + size + header[f"e{e}"]["data_offsets"][0] for e in range(n)]


@dataclass
class _LayerCache:
    num_experts: int
    parts: list[torch.Tensor]  # resident part tensors [C, ...] each
    layout: BlobLayout
    backing: _Backing
    template: ExpertWeights  # formats and group sizes
    slot_of: torch.Tensor  # [E] int64 slot, -1 when not resident (CPU)
    expert_in: list[int]  # [C] expert in each slot, -1 = free
    loading: dict[int, int] = field(default_factory=dict)  # expert → slot being filled by the thread
    last_used: np.ndarray | None = None  # [E] step tick of last use
    uses: np.ndarray | None = None  # [E]
    predicted: dict[int, int] = field(default_factory=dict)  # expert → distance of the latest prediction
    prefetched: set[int] = field(default_factory=set)  # resident by prefetch, not used yet
    tick: int = 0
    stats: LayerStats = field(default_factory=LayerStats)

    @property
    def capacity(self) -> int:
        return len(self.expert_in)


class OffloadingExpertStore:
    """See the module docstring. `layers`: every layer's experts in full (the source of the blobs,
    released after start-up); `warm_loads` [Lm, E]: start with each layer's most loaded experts."""

    resident = False  # acquire loads what the ids need

    def __init__(self, layers: dict[int, ExpertWeights], top_k: int, settings: OffloadSettings,
                 device: torch.device | str = "cpu", warm_loads: np.ndarray | None = None):
        self.settings, self.device, self.top_k = settings, torch.device(device), top_k
        self._check(layers, top_k)
        self._order = sorted(layers)
        self._tmpdir = None
        self._dir = self._disk_dir() if settings.tier == "disk" else None
        self._lock = threading.Condition()
        self._queue: collections.deque = collections.deque()  # (layer, expert, distance)
        self._thread: threading.Thread | None = None
        self._stop = False
        self._routers: dict[int, object] = {}
        self._in_use: tuple[int, set[int]] = (-1, set())
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._caches = {i: self._build(i, w) for i, w in layers.items()}
        for j, i in enumerate(self._order):
            self._warm(i, None if warm_loads is None else warm_loads[j])

    # --- setup -------------------------------------------------------------------------------------
    def _check(self, layers: dict[int, ExpertWeights], top_k: int) -> None:
        s = self.settings
        if s.policy not in POLICIES or s.tier not in TIERS:
            raise OffloadError(f"offload policy must be one of {POLICIES} and tier one of {TIERS}")
        E = next(iter(layers.values())).slots.num_experts
        if s.capacity < top_k:
            raise OffloadError(f"offload resident capacity {s.capacity} experts per layer is below top-k {top_k}: "
                               "one token could not have its experts resident; raise it to at least top-k")
        if s.capacity > E:
            raise OffloadError(f"offload resident capacity {s.capacity} exceeds the {E} experts of a layer")
        for i, w in layers.items():
            if w.mixed or not w.slots.identity:
                raise OffloadError(f"layer {i}: offloading layers that mix expert formats or hold replicas is "
                                   "not supported yet; use one format (quant.experts) or no offload")
        if not 0 <= s.prefetch_depth <= 3:
            raise OffloadError(f"offload prefetch depth {s.prefetch_depth} must be within 0..3")

    def _disk_dir(self) -> Path:
        if self.settings.dir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="moetune-offload-")
            return Path(self._tmpdir)
        path = Path(self.settings.dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=path, prefix=".moetune-probe-")
            probe.close()
        except OSError as exc:
            raise OffloadError(f"offload directory '{path}' cannot be used ({exc.strerror or exc}); "
                               "give a writable directory in offload.dir") from None
        return path

    def _build(self, i: int, w: ExpertWeights) -> _LayerCache:
        E, C = w.num_slots, self.settings.capacity
        layout = BlobLayout.of(w)
        blobs = [_blob(w, e) for e in range(E)]
        if self._dir is not None:
            backing = _DiskBacking(blobs, layout, self._dir / f"layer{i}.safetensors", self.device)
        else:
            backing = _Backing(blobs, layout, pin=self.device.type == "cuda")
        parts = [torch.empty(C, *shape, dtype=dtype, device=self.device) for _, dtype, shape, _, _ in layout.parts]
        template = ExpertWeights(w.w13, w.w2, w.slots)
        return _LayerCache(E, parts, layout, backing, template, torch.full((E,), -1, dtype=torch.int64), [-1] * C,
                           last_used=np.zeros(E, dtype=np.int64), uses=np.zeros(E, dtype=np.int64))

    def _warm(self, i: int, loads: np.ndarray | None) -> None:
        """Fill every slot: the most loaded experts first (or 0..C-1 without loads)."""
        cache = self._caches[i]
        order = range(cache.capacity) if loads is None else np.argsort(-loads, kind="stable")[:cache.capacity]
        for slot, e in enumerate(int(x) for x in order):
            self._fill(cache, int(e), slot, None)
            cache.expert_in[slot], cache.slot_of[e] = int(e), slot
        cache.stats = LayerStats()

    def bind_routers(self, routers: dict[int, object]) -> None:
        """layer → callable(hidden [T, D]) → topk_ids [T, K]: how prefetch predicts later layers."""
        self._routers = dict(routers)

    # --- the ExpertStore protocol --------------------------------------------------------------
    def layers(self) -> list[int]:
        return list(self._order)

    def nbytes(self) -> int:
        """Resident bytes (the cache), not the backing tier."""
        return sum(t.untyped_storage().nbytes() for c in self._caches.values() for t in c.parts)

    def acquire(self, layer: int, topk_ids: torch.Tensor) -> ExpertWeights:
        start = time.perf_counter()
        cache = self._caches[layer]
        needed = [int(e) for e in torch.unique(topk_ids).tolist()]
        with self._lock:
            self._queue = collections.deque(t for t in self._queue if t[0] != layer)  # demand replaces them
            cache.tick += 1
            for e in needed:
                cache.last_used[e], cache.uses[e] = cache.tick, cache.uses[e] + 1
            self._in_use = (layer, set(needed))
            if len(needed) > cache.capacity:
                weights = self._overflow(cache, needed)
            else:
                self._make_resident(cache, needed)
                weights = self._weights(cache)
        cache.stats.wait_s += time.perf_counter() - start
        return weights

    def prefetch(self, layer: int, topk_ids: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        depth = self.settings.prefetch_depth
        if depth == 0 or hidden is None or hidden.shape[0] == 0 or not self._routers:
            return
        j = self._order.index(layer)
        tasks = []
        for d, nxt in enumerate(self._order[j + 1: j + 1 + depth], start=1):
            if nxt not in self._routers:
                continue
            ids = torch.unique(self._routers[nxt](hidden)).tolist()  # [K'] predicted experts of layer nxt
            cache = self._caches[nxt]
            cache.predicted = {int(e): d for e in ids}
            tasks += [(nxt, int(e), d) for e in ids]
        with self._lock:
            self._queue.extend(tasks)
            self._lock.notify_all()
        self._start_thread()

    # --- residency -----------------------------------------------------------------------------
    def _make_resident(self, cache: _LayerCache, needed: list[int]) -> None:
        """Under the lock: wait for loading ones, fetch the rest on this thread."""
        s = cache.stats
        for e in needed:
            while e in cache.loading:
                self._lock.wait()
            slot = int(cache.slot_of[e])
            if slot >= 0:
                s.hits += 1
                if e in cache.prefetched:
                    cache.prefetched.discard(e)
                    s.prefetch_used += 1
                    s.prefetch_hits += 1
                continue
            s.misses += 1
            slot = self._victim(cache, set(needed))
            while slot < 0:  # every other slot is being filled by the prefetch thread
                self._lock.wait()
                slot = self._victim(cache, set(needed))
            self._evict(cache, slot)
            self._fill(cache, e, slot, None)
            cache.expert_in[slot], cache.slot_of[e] = e, slot

    def _victim(self, cache: _LayerCache, keep: set[int]) -> int:
        """The slot to reuse: a free one, else the policy's choice among experts not in `keep`."""
        free = [s for s, e in enumerate(cache.expert_in) if e < 0 and s not in cache.loading.values()]
        if free:
            return free[0]
        busy = set(cache.loading.values())
        cands = [(s, e) for s, e in enumerate(cache.expert_in) if e not in keep and s not in busy]
        if not cands:
            return -1
        return min(cands, key=lambda se: self._rank(cache, se[1]))[0]

    def _rank(self, cache: _LayerCache, e: int) -> tuple:
        """Smaller = evicted first."""
        p = self.settings.policy
        if p == "lru":
            return (cache.last_used[e], e)
        if p == "lfu":
            return (cache.uses[e], cache.last_used[e], e)
        recency = 1.0 / (1 + cache.tick - cache.last_used[e])
        freq = cache.uses[e] / max(1, cache.uses.max())
        pred = 1.0 / cache.predicted[e] if e in cache.predicted else 0.0
        return (0.5 * recency + 0.3 * freq + 0.2 * pred, e)

    def _evict(self, cache: _LayerCache, slot: int) -> None:
        old = cache.expert_in[slot]
        if old >= 0:
            cache.slot_of[old] = -1
            cache.prefetched.discard(old)
        cache.expert_in[slot] = -1

    def _fill(self, cache: _LayerCache, e: int, slot: int, stream) -> None:
        cache.backing.read(e, [p[slot] for p in cache.parts], stream)
        self._count_bytes(cache)

    def _weights(self, cache: _LayerCache) -> ExpertWeights:
        E, C = cache.num_experts, cache.capacity
        slot_of = cache.slot_of.clamp_min(0).to(self.device)[:, None]  # [E, 1]; non-resident rows unused
        slots = SlotMap(E, C, slot_of, torch.ones(E, dtype=torch.int64, device=self.device))
        return self._packed(cache, cache.parts, slots)

    def _packed(self, cache: _LayerCache, parts: list[torch.Tensor], slots: SlotMap) -> ExpertWeights:
        named = dict(zip([p[0] for p in cache.layout.parts], parts))
        t13, t2 = cache.template.w13, cache.template.w2
        w13 = PackedWeight(named["w13"], named.get("w13_scale"), t13.fmt, t13.group_size)
        w2 = PackedWeight(named["w2"], named.get("w2_scale"), t2.fmt, t2.group_size)
        return ExpertWeights(w13, w2, slots)

    def _overflow(self, cache: _LayerCache, needed: list[int]) -> ExpertWeights:
        """More distinct experts than slots: a transient buffer of exactly `needed` (cache unchanged)."""
        cache.stats.overflow_steps += 1
        n, E = len(needed), cache.num_experts
        parts = [torch.empty(n, *p.shape[1:], dtype=p.dtype, device=p.device) for p in cache.parts]
        for j, e in enumerate(needed):
            while e in cache.loading:
                self._lock.wait()
            slot = int(cache.slot_of[e])
            if slot >= 0:
                cache.stats.hits += 1
                for dst, src in zip(parts, cache.parts):
                    dst[j].copy_(src[slot])
            else:
                cache.stats.misses += 1
                cache.backing.read(e, [p[j] for p in parts])
                self._count_bytes(cache)
        slot_of = torch.zeros(E, dtype=torch.int64)
        slot_of[torch.tensor(needed)] = torch.arange(n)
        slots = SlotMap(E, n, slot_of.to(self.device)[:, None], torch.ones(E, dtype=torch.int64, device=self.device))
        return self._packed(cache, parts, slots)

    def _count_bytes(self, cache: _LayerCache) -> None:
        if cache.backing.tier == "disk":
            cache.stats.bytes_disk += cache.layout.nbytes
        else:
            cache.stats.bytes_host += cache.layout.nbytes

    # --- the prefetch thread -------------------------------------------------------------------
    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="moetune-prefetch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stop:
                    self._lock.wait()
                if self._stop:
                    return
                layer, e, _ = self._queue.popleft()
                cache = self._caches[layer]
                if cache.slot_of[e] >= 0 or e in cache.loading:
                    continue
                keep = self._in_use[1] if self._in_use[0] == layer else set()
                keep = keep | set(cache.predicted)  # never evict one prediction for another
                slot = self._victim(cache, keep)
                if slot < 0:
                    continue  # every slot is needed now, predicted or loading: skip this prefetch
                self._evict(cache, slot)
                cache.loading[e] = slot
            self._fill_async(cache, e, slot)
            with self._lock:
                del cache.loading[e]
                cache.expert_in[slot], cache.slot_of[e] = e, slot
                cache.prefetched.add(e)
                cache.stats.prefetch_issued += 1
                self._lock.notify_all()

    def _fill_async(self, cache: _LayerCache, e: int, slot: int) -> None:
        if self._stream is None:
            self._fill(cache, e, slot, None)
            return
        with torch.cuda.stream(self._stream):
            self._fill(cache, e, slot, self._stream)
        self._stream.synchronize()

    # --- results and shutdown --------------------------------------------------------------------
    def stats(self) -> dict[int, dict]:
        """Per MoE layer: LayerStats.row() plus resident bytes."""
        out = {}
        for i, c in self._caches.items():
            out[i] = {**c.stats.row(), "resident_bytes": sum(p.untyped_storage().nbytes() for p in c.parts),
                      "capacity": c.capacity}
        return out

    def reset_stats(self) -> None:
        for c in self._caches.values():
            c.stats = LayerStats()

    def drain(self) -> None:
        """Wait until the prefetch queue is empty and nothing is loading (tests, benchmarks)."""
        with self._lock:
            while self._queue or any(c.loading for c in self._caches.values()):
                self._lock.wait(0.01)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for c in self._caches.values():
            c.backing.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
