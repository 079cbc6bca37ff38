"""OffloadingExpertStore: only `capacity` experts per MoE layer resident; the rest fetched on demand
from host memory or disk, with eviction (LRU / LFU / score) and prefetch of the next layers' experts.

Layout. Each expert is one contiguous blob in its backing tier, its four parts back to back:
w13 data | w13 scales | w2 data | w2 scales (`BlobLayout`, one per weight format). Per layer the
resident cache is C slots; a layer whose experts mix formats (per-expert quantization) splits them
into one *region* per format, C_f slots each (C shared in proportion to the experts of each format,
largest remainders, at least one slot per format), and an expert only ever takes a slot of its own
format's region. Each region is four contiguous stacked tensors (w13 [C_f, 2I, D], ...), and the
regions are the format groups of the `ExpertWeights` the kernels read (contiguous slot ranges,
experts/store.py), so every kernel backend reads the cache like any other layer; a fetch is one read
of the blob, scattered into slot s of its region's four tensors (disk: one `preadv` straight into
them; host: four slice copies, non-blocking from pinned memory on CUDA).

Tiers. `host`: blobs in (pinned, on CUDA) host memory. `disk`: one safetensors file per layer
written at start (tensor `e{expert}` = the blob), read back with `os.preadv` at the header's
offsets — never mmap — and `posix_fadvise(DONTNEED)` after each read and after writing, so every
fetch really goes to the device instead of the page cache (what `moetune bench` numbers from disk
mean).

Acquire(layer, topk_ids): the distinct experts of the step must be resident. Hits cost nothing; an
expert a prefetch is loading is waited for; the rest are demand fetches, run at once on the calling
thread (never queued behind speculative work), evicting the policy's victim among the slots of
the expert's region not needed this step. Queued speculative fetches for this layer are dropped
(demand replaced them). A step needing more distinct experts of one format than its region holds
gets a transient buffer of exactly the step's experts (resident ones copied, others fetched; the
cache keeps its contents).

Prefetch(layer, topk_ids, hidden), depth d: the routers of the next d MoE layers are applied to
this layer's input `hidden` (`bind_routers`), and their predicted experts queued for a background
thread (on CUDA it copies on its own stream). The thread never evicts an expert of the layer being
computed that this step uses.

Hints: `settings.hints` picks the prefetch sources — `router` (router-ahead, above), `history`
(`hint(layer, experts)`: before each step the engine hands every MoE layer the experts the step's
decodes chose in their last tokens, from the per-sequence traces beside the KV blocks,
engine/expert_trace.py), or `both`. Each prefetched expert remembers its source; issued, used and
hits are counted per source (precision = used / issued, recall = hits / (prefetch hits + misses)).

Lifecycle (`settings.demote_after` N > 0): a resident expert that N consecutive steps of its layer
did not use is demoted — its slot freed, the expert back in its backing tier only (device → host, or
device → disk) — and promoted again on its next use (a demand fetch or a prefetch). A freed slot
is taken before any eviction. Warm-up fills the slots most loaded first (`warm_loads`: a profile
or serve recording run dir, or a JSON loads file). Counters per tier (`stats()["tiers"]`): device
resident experts, demotions and promotions; the backing tier's reads and bytes.

Disk below host (`settings.disk_after` N > 0, host tier): an expert that N consecutive steps of its
layer neither used nor held on the device is demoted again, host → disk (experts/spill.py: one file
per expert in `dir`, written atomically; the host copy dropped), and promoted back (disk → host →
device) on its next use — on the prefetch thread when a prefetch asks for it. The tiers' row then
has a `disk` entry: experts on disk only, writes, bytes written, reads and bytes read, demotions and
promotions.

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
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from moetune.experts.backing import BlobLayout, DiskBacking, HostBacking, expert_blob
from moetune.experts.offload_config import (HINTS, POLICIES, TIERS, LayerStats, OffloadError, OffloadSettings,
                                            region_sizes)
from moetune.experts.spill import SpillCounts, SpillingBacking
from moetune.experts.store import ExpertWeights, FormatGroup, SlotMap
from moetune.kernels.quant_formats import PackedWeight


def _reset_counts(cache: "_LayerCache") -> None:
    cache.stats = LayerStats()
    if isinstance(cache.backing, SpillingBacking):
        cache.backing.counts = SpillCounts()


@dataclass(frozen=True)
class _Region:
    """Cache slots [start, stop) of one weight format: its four part tensors [stop - start, ...]."""

    start: int
    stop: int
    parts: tuple[torch.Tensor, ...]
    layout: BlobLayout
    template: FormatGroup  # formats and group sizes
    written: torch.Tensor  # [stop - start] int64: writes into each slot (`PackedWeight.generation`)

    def packed(self, parts, start: int, stop: int) -> FormatGroup:
        """The slots as a FormatGroup: the region's own tensors carry their write counts (kernels cache
        what they derive from a slot until it is written again); other `parts` (a step's transient
        buffer) are marked unstable."""
        named = dict(zip([p[0] for p in self.layout.parts], parts))
        t13, t2 = self.template.w13, self.template.w2
        own = parts is self.parts
        kw = {"generation": self.written} if own else {"stable": False}
        w13 = PackedWeight(named["w13"], named.get("w13_scale"), t13.fmt, t13.group_size, **kw)
        w2 = PackedWeight(named["w2"], named.get("w2_scale"), t2.fmt, t2.group_size, **kw)
        return FormatGroup(start, stop, w13, w2)


@dataclass
class _LayerCache:
    num_experts: int
    regions: list[_Region]  # one per weight format, slot ranges in order
    region_of: list[int]  # [E] the region of each expert's format
    backing: HostBacking
    slot_of: torch.Tensor  # [E] int64 slot, -1 when not resident (CPU)
    expert_in: list[int]  # [C] expert in each slot, -1 = free
    loading: dict[int, int] = field(default_factory=dict)  # expert → slot being filled by the thread
    last_used: np.ndarray | None = None  # [E] step tick of last use
    uses: np.ndarray | None = None  # [E]
    predicted: dict[int, int] = field(default_factory=dict)  # expert → distance of the latest prediction
    prefetched: dict[int, str] = field(default_factory=dict)  # resident by prefetch, not used yet → its source
    tick: int = 0
    stats: LayerStats = field(default_factory=LayerStats)
    demoted: set[int] = field(default_factory=set)  # demoted, not resident again yet

    @property
    def capacity(self) -> int:
        return len(self.expert_in)

    def region(self, e: int) -> _Region:
        return self.regions[self.region_of[e]]

    def dests(self, e: int, slot: int) -> list[torch.Tensor]:
        """The part tensors of cache slot `slot` (in expert e's region)."""
        r = self.region(e)
        return [p[slot - r.start] for p in r.parts]


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
        self._dir = self._disk_dir() if settings.tier == "disk" or settings.disk_after else None
        self._lock = threading.Condition()
        self._queue: collections.deque = collections.deque()  # (layer, expert, distance, source)
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
        if s.policy not in POLICIES or s.tier not in TIERS or s.hints not in HINTS:
            raise OffloadError(f"offload policy must be one of {POLICIES}, tier one of {TIERS} and hints one of {HINTS}")
        E = next(iter(layers.values())).slots.num_experts
        if s.capacity < top_k:
            raise OffloadError(f"offload resident capacity {s.capacity} experts per layer is below top-k {top_k}: "
                               "one token could not have its experts resident; raise it to at least top-k")
        if s.capacity > E:
            raise OffloadError(f"offload resident capacity {s.capacity} exceeds the {E} experts of a layer")
        for i, w in layers.items():
            if w.num_slots != E or (w.slots.counts is not None and int(w.slots.counts.max()) > 1):
                raise OffloadError(f"layer {i}: offloading under expert parallelism or with replicas is not "
                                   "supported yet; use parallel.ep_size 1 and redundant_experts 0 with offload")
            if len(w.groups) > s.capacity:
                raise OffloadError(f"offload resident capacity {s.capacity} experts per layer is below the "
                                   f"{len(w.groups)} expert formats of layer {i} (each format needs a slot)")
        if s.disk_after and s.tier == "disk":
            raise OffloadError("offload disk_after demotes idle host experts to disk, but with tier disk every "
                               "non-resident expert is on disk already: use tier host with disk_after, or drop it")
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
        ids = torch.arange(E, device=w.groups[0].w13.data.device)[:, None]  # [E, 1]
        slot = w.slots.physical(ids)[:, 0].tolist()  # [E] the slot of each expert
        group_of = [next(g for g, grp in enumerate(w.groups) if grp.start <= s < grp.stop) for s in slot]
        layouts = [BlobLayout.of(g.w13, g.w2) for g in w.groups]
        blobs = [expert_blob(w.groups[group_of[e]], slot[e] - w.groups[group_of[e]].start) for e in range(E)]
        per_expert = [layouts[group_of[e]] for e in range(E)]
        if self.settings.tier == "disk":
            backing = DiskBacking(blobs, per_expert, self._dir / f"layer{i}.safetensors", self.device)
        elif self._dir is not None:  # host tier with disk below it
            backing = SpillingBacking(blobs, per_expert, self._dir, i, pin=self.device.type == "cuda")
        else:
            backing = HostBacking(blobs, per_expert, pin=self.device.type == "cuda")
        regions, start = [], 0
        for g, size in enumerate(region_sizes(C, [grp.size for grp in w.groups])):
            parts = tuple(torch.empty(size, *shape, dtype=dtype, device=self.device)
                          for _, dtype, shape, _, _ in layouts[g].parts)
            regions.append(_Region(start, start + size, parts, layouts[g], w.groups[g],
                                   torch.zeros(size, dtype=torch.int64)))
            start += size
        return _LayerCache(E, regions, group_of, backing, torch.full((E,), -1, dtype=torch.int64), [-1] * C,
                           last_used=np.zeros(E, dtype=np.int64), uses=np.zeros(E, dtype=np.int64))

    def _warm(self, i: int, loads: np.ndarray | None) -> None:
        """Fill every slot: the most loaded experts first (or in expert order without loads), each
        into the next free slot of its format's region."""
        cache = self._caches[i]
        order = range(cache.num_experts) if loads is None else np.argsort(-loads, kind="stable")
        free = {g: list(range(r.start, r.stop)) for g, r in enumerate(cache.regions)}
        for e in (int(x) for x in order):
            if free[cache.region_of[e]]:
                slot = free[cache.region_of[e]].pop(0)
                self._fill(cache, e, slot, None)
                cache.expert_in[slot], cache.slot_of[e] = e, slot
        _reset_counts(cache)

    def bind_routers(self, routers: dict[int, object]) -> None:
        """layer → callable(hidden [T, D]) → topk_ids [T, K]: how prefetch predicts later layers."""
        self._routers = dict(routers)

    # --- the ExpertStore protocol --------------------------------------------------------------
    def layers(self) -> list[int]:
        return list(self._order)

    def nbytes(self) -> int:
        """Resident bytes (the cache), not the backing tier."""
        return sum(t.untyped_storage().nbytes() for c in self._caches.values() for r in c.regions for t in r.parts)

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
            if self.settings.demote_after:
                self._demote_idle(cache, set(needed))
            if self.settings.disk_after:
                self._spill_idle(cache, set(needed))
            if self._overflows(cache, needed):
                weights = self._overflow(cache, needed)
            else:
                self._make_resident(cache, needed)
                weights = self._weights(cache)
        cache.stats.wait_s += time.perf_counter() - start
        return weights

    @property
    def wants_hints(self) -> bool:
        return self.settings.hints in ("history", "both") and self.settings.prefetch_depth > 0

    def hint(self, layer: int, experts: list[int]) -> None:
        """History hints: `experts` of `layer` are likely needed this step; queued for the thread."""
        if not self.wants_hints or not experts:
            return
        cache = self._caches[layer]
        with self._lock:
            if self.settings.hints == "history":  # the latest hint is the layer's prediction (router-ahead's too)
                cache.predicted = {}
            for e in experts:
                cache.predicted.setdefault(int(e), 1)
            self._queue.extend((layer, int(e), 1, "history") for e in experts)
            self._lock.notify_all()
        self._start_thread()

    def prefetch(self, layer: int, topk_ids: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        depth = self.settings.prefetch_depth
        if depth == 0 or hidden is None or hidden.shape[0] == 0 or not self._routers:
            return
        if self.settings.hints == "history":
            return
        j = self._order.index(layer)
        tasks = []
        for d, nxt in enumerate(self._order[j + 1: j + 1 + depth], start=1):
            if nxt not in self._routers:
                continue
            ids = torch.unique(self._routers[nxt](hidden)).tolist()  # [K'] predicted experts of layer nxt
            cache = self._caches[nxt]
            cache.predicted = {int(e): d for e in ids}
            tasks += [(nxt, int(e), d, "router") for e in ids]
        with self._lock:
            self._queue.extend(tasks)
            self._lock.notify_all()
        self._start_thread()

    # --- residency -----------------------------------------------------------------------------
    @staticmethod
    def _overflows(cache: _LayerCache, needed: list[int]) -> bool:
        """More distinct experts of one format than its region has slots."""
        wanted = collections.Counter(cache.region_of[e] for e in needed)
        return any(n > cache.regions[g].stop - cache.regions[g].start for g, n in wanted.items())

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
                    counts = s.by_source[cache.prefetched.pop(e)]
                    counts[1] += 1
                    counts[2] += 1
                    s.prefetch_used += 1
                    s.prefetch_hits += 1
                continue
            s.misses += 1
            slot = self._victim(cache, set(needed), e)
            while slot < 0:  # every other slot is being filled by the prefetch thread
                self._lock.wait()
                slot = self._victim(cache, set(needed), e)
            self._evict(cache, slot)
            self._fill(cache, e, slot, None)
            cache.expert_in[slot], cache.slot_of[e] = e, slot
            self._promoted(cache, e)

    def _demote_idle(self, cache: _LayerCache, needed: set[int]) -> None:
        """Under the lock: free the slots of experts unused for demote_after steps of this layer."""
        N, busy = self.settings.demote_after, set(cache.loading.values())
        for slot, e in enumerate(cache.expert_in):
            if e >= 0 and e not in needed and slot not in busy and cache.tick - cache.last_used[e] >= N \
                    and e not in cache.prefetched:
                self._evict(cache, slot)
                cache.demoted.add(e)
                cache.stats.demotions += 1

    def _spill_idle(self, cache: _LayerCache, needed: set[int]) -> None:
        """Under the lock: host → disk for experts neither on the device nor used for disk_after steps."""
        N, backing = self.settings.disk_after, cache.backing
        for e in range(cache.num_experts):
            if cache.slot_of[e] < 0 and e not in cache.loading and e not in needed and backing.at_host(e) \
                    and cache.tick - cache.last_used[e] >= N:
                backing.demote(e)

    def _promoted(self, cache: _LayerCache, e: int) -> None:
        if e in cache.demoted:
            cache.demoted.discard(e)
            cache.stats.promotions += 1

    def _victim(self, cache: _LayerCache, keep: set[int], incoming: int) -> int:
        """The slot of `incoming`'s region to reuse: a free one, else the policy's choice among
        experts not in `keep`."""
        r = cache.region(incoming)
        busy = set(cache.loading.values())
        free = [s for s in range(r.start, r.stop) if cache.expert_in[s] < 0 and s not in busy]
        if free:
            return free[0]
        cands = [(s, cache.expert_in[s]) for s in range(r.start, r.stop)
                 if cache.expert_in[s] not in keep and s not in busy]
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
            cache.prefetched.pop(old, None)
        cache.expert_in[slot] = -1

    def _fill(self, cache: _LayerCache, e: int, slot: int, stream) -> None:
        """Expert e into cache slot `slot`, then its write counted (after the read: a kernel that sees
        the new count reads the new bytes; on CUDA the counts are not read, q4r is CPU-only)."""
        self._count_bytes(cache, e, cache.backing.read(e, cache.dests(e, slot), stream))
        r = cache.region(e)
        r.written[slot - r.start] += 1

    def _weights(self, cache: _LayerCache) -> ExpertWeights:
        E, C = cache.num_experts, cache.capacity
        slot_of = cache.slot_of.clamp_min(0).to(self.device)[:, None]  # [E, 1]; non-resident rows unused
        slots = SlotMap(E, C, slot_of, torch.ones(E, dtype=torch.int64, device=self.device))
        return ExpertWeights.from_groups([r.packed(r.parts, r.start, r.stop) for r in cache.regions], slots)

    def _overflow(self, cache: _LayerCache, needed: list[int]) -> ExpertWeights:
        """More distinct experts of a format than its slots: a transient buffer of exactly `needed`,
        grouped by format (cache unchanged)."""
        cache.stats.overflow_steps += 1
        E = cache.num_experts
        ordered = sorted(needed, key=lambda e: (cache.region_of[e], e))  # [n] one contiguous run per format
        groups, at = [], 0
        for g, region in enumerate(cache.regions):
            mine = [e for e in ordered if cache.region_of[e] == g]
            if not mine:
                continue
            parts = [torch.empty(len(mine), *p.shape[1:], dtype=p.dtype, device=p.device) for p in region.parts]
            for j, e in enumerate(mine):
                self._copy_in(cache, e, [p[j] for p in parts])
            groups.append(region.packed(parts, at, at + len(mine)))
            at += len(mine)
        slot_of = torch.zeros(E, dtype=torch.int64)
        slot_of[torch.tensor(ordered)] = torch.arange(len(ordered))
        slots = SlotMap(E, len(ordered), slot_of.to(self.device)[:, None],
                        torch.ones(E, dtype=torch.int64, device=self.device))
        return ExpertWeights.from_groups(groups, slots)

    def _copy_in(self, cache: _LayerCache, e: int, dests: list[torch.Tensor]) -> None:
        """Expert e's parts into `dests`: from its cache slot when resident, else from the tier."""
        while e in cache.loading:
            self._lock.wait()
        slot = int(cache.slot_of[e])
        if slot >= 0:
            cache.stats.hits += 1
            for dst, src in zip(dests, cache.dests(e, slot)):
                dst.copy_(src)
        else:
            cache.stats.misses += 1
            self._count_bytes(cache, e, cache.backing.read(e, dests))

    def _count_bytes(self, cache: _LayerCache, e: int, tier: str) -> None:
        n = cache.backing.layouts[e].nbytes
        if tier == "disk":
            cache.stats.bytes_disk += n
        else:
            cache.stats.bytes_host += n

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
                layer, e, _, source = self._queue.popleft()
                cache = self._caches[layer]
                if cache.slot_of[e] >= 0 or e in cache.loading:
                    continue
                keep = self._in_use[1] if self._in_use[0] == layer else set()
                keep = keep | set(cache.predicted)  # never evict one prediction for another
                slot = self._victim(cache, keep, e)
                if slot < 0:
                    continue  # every slot is needed now, predicted or loading: skip this prefetch
                self._evict(cache, slot)
                cache.loading[e] = slot
            self._fill_async(cache, e, slot)
            with self._lock:
                del cache.loading[e]
                cache.expert_in[slot], cache.slot_of[e] = e, slot
                cache.prefetched[e] = source
                self._promoted(cache, e)
                cache.stats.prefetch_issued += 1
                cache.stats.by_source[source][0] += 1
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
            out[i] = {**c.stats.row(), "capacity": c.capacity,
                      "resident_bytes": sum(p.untyped_storage().nbytes() for r in c.regions for p in r.parts),
                      "tiers": self._tier_row(c)}
        return out

    def _tier_row(self, c: _LayerCache) -> dict:
        """Counters per tier: the device cache's residents, demotions, promotions; the backing tier's reads."""
        s, tier = c.stats, c.backing.tier
        row = {"device": {"resident": sum(e >= 0 for e in c.expert_in), "demotions": s.demotions,
                          "promotions": s.promotions},
               tier: {"reads": s.misses + s.prefetch_issued, "bytes": s.bytes_disk if tier == "disk" else s.bytes_host}}
        if isinstance(c.backing, SpillingBacking):
            n = c.backing.counts
            row["host"] = {"reads": n.reads_host, "bytes": n.bytes_host}
            row["disk"] = {"on_disk": c.backing.on_disk(), "writes": n.writes, "bytes_written": n.bytes_written,
                           "reads": n.reads_disk, "bytes": n.bytes_disk, "demotions": n.demotions,
                           "promotions": n.promotions}
        return row

    def reset_stats(self) -> None:
        for c in self._caches.values():
            _reset_counts(c)

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
