"""Offloaded experts: a cache of resident expert slots per (rank, layer), replayed step by step.

Each step, a rank needs the slots its tokens were routed to in each MoE layer. A needed slot that
is not resident is fetched over the host link (`Hardware.host_bw`); the cache evicts by `lru`
(least recently needed) or `lfu` (least often needed so far). With prefetch depth d > 0, the slots
a layer needed in the previous step are fetched d layers ahead (the predictor: routing repeats
from one step to the next); a fetched slot that is then needed costs only what the d layers of
compute in between did not hide. A wrong guess costs host-link time that nobody waits for, and its
bytes are counted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class SlotCache:
    capacity: int
    eviction: str = "lru"
    resident: OrderedDict = field(default_factory=OrderedDict)  # slot → None, least recent first
    uses: dict = field(default_factory=dict)  # slot → times needed (lfu)

    def touch(self, slot: int) -> bool:
        """Mark `slot` needed; True when it was resident (a hit)."""
        self.uses[slot] = self.uses.get(slot, 0) + 1
        if slot in self.resident:
            self.resident.move_to_end(slot)
            return True
        self.insert(slot)
        return False

    def insert(self, slot: int) -> None:
        if slot in self.resident:
            return
        if len(self.resident) >= self.capacity:
            self.evict()
        self.resident[slot] = None

    def evict(self) -> None:
        if self.eviction == "lfu":
            victim = min(self.resident, key=lambda s: self.uses.get(s, 0))
            del self.resident[victim]
        else:
            self.resident.popitem(last=False)


@dataclass
class OffloadState:
    """One cache per (rank, layer) and the previous step's needs (the prefetch predictor)."""

    capacity: int
    eviction: str
    depth: int
    caches: dict = field(default_factory=dict)
    previous: dict = field(default_factory=dict)
    wasted_bytes: float = 0.0
    fetched_bytes: float = 0.0
    misses: int = 0
    needs: int = 0

    def step(self, rank: int, layer: int, needed: list[int], slot_bytes, host_bw: float,
             hidden_s: float, copy_bw: float | None = None) -> float:
        """Stall seconds of this rank at this layer; `hidden_s` = compute time of the d layers before."""
        cache = self.caches.setdefault((rank, layer), SlotCache(self.capacity, self.eviction))
        if len(needed) > self.capacity:
            return self._overflow(cache, rank, layer, needed, slot_bytes, host_bw, copy_bw or host_bw)
        prefetched: set[int] = set()
        if self.depth > 0:
            for slot in self.previous.get((rank, layer), ()):
                if slot not in cache.resident:
                    cache.insert(slot)
                    prefetched.add(slot)
                    self.fetched_bytes += slot_bytes[slot]
        self.previous[(rank, layer)] = needed
        stall_bytes = hidden_bytes = 0.0
        for slot in needed:
            self.needs += 1
            if slot in prefetched:
                cache.touch(slot)
                hidden_bytes += slot_bytes[slot]
                prefetched.discard(slot)
            elif not cache.touch(slot):
                self.misses += 1
                stall_bytes += slot_bytes[slot]
                self.fetched_bytes += slot_bytes[slot]
        self.wasted_bytes += sum(slot_bytes[s] for s in prefetched)
        return stall_bytes / host_bw + max(0.0, hidden_bytes / host_bw - hidden_s)

    def _overflow(self, cache: SlotCache, rank: int, layer: int, needed: list[int], slot_bytes, host_bw: float,
                  copy_bw: float) -> float:
        """More slots needed than resident: every needed slot goes into a transient buffer."""
        self.previous[(rank, layer)] = needed
        missing = [s for s in needed if s not in cache.resident]
        self.needs += len(needed)
        self.misses += len(missing)
        fetched = float(sum(slot_bytes[s] for s in missing))
        copied = float(sum(slot_bytes[s] for s in needed if s in cache.resident))
        self.fetched_bytes += fetched
        for s in needed:
            cache.uses[s] = cache.uses.get(s, 0) + 1
        return fetched / host_bw + copied / copy_bw
