"""The offload store's settings, its one error, the per-layer counters and how C cache slots are shared
among a layer's weight formats (experts/offload.py says what each setting does)."""

from __future__ import annotations

from dataclasses import dataclass, field

from moetune.errors import MoetuneError

POLICIES = ("lru", "lfu", "score")
HINTS = ("router", "history", "both")
SOURCES = ("router", "history")
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
    hints: str = "router"  # prefetch sources: router (router-ahead) | history (traces) | both
    demote_after: int = 0  # steps of a layer an expert may stay resident unused (0: never demoted)
    disk_after: int = 0  # host tier: steps of a layer an expert may stay at host unused, then to disk (0: never)


def region_sizes(capacity: int, group_sizes: list[int]) -> list[int]:
    """C cache slots shared among a layer's formats in proportion to their experts (largest
    remainders first), each format at least one slot and at most its experts: [C_f] summing to C
    (C is at least the number of formats and at most the experts)."""
    E = sum(group_sizes)
    sizes = [max(1, capacity * n // E) for n in group_sizes]
    order = sorted(range(len(group_sizes)), key=lambda g: (-(capacity * group_sizes[g] % E), g))
    k = 0
    while sum(sizes) < capacity:
        g = order[k % len(order)]
        k += 1
        if sizes[g] < group_sizes[g]:
            sizes[g] += 1
    while sum(sizes) > capacity:  # the one-slot minimum took slots from the larger formats
        g = max(range(len(sizes)), key=lambda j: (sizes[j], -j))
        sizes[g] -= 1
    return sizes


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
    by_source: dict = field(default_factory=lambda: {s: [0, 0, 0] for s in SOURCES})  # issued, used, hits
    demotions: int = 0  # resident experts demoted to the backing tier after demote_after idle steps
    promotions: int = 0  # demoted experts made resident again on use

    def source_rows(self) -> dict:
        wanted = self.prefetch_hits + self.misses
        return {src: {"issued": i, "used": u, "hits": h, "precision": u / i if i else None,
                      "recall": h / wanted if wanted else None} for src, (i, u, h) in self.by_source.items()}

    def row(self) -> dict:
        looked = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / looked if looked else 1.0,
                "prefetch_issued": self.prefetch_issued, "prefetch_used": self.prefetch_used,
                "prefetch_precision": self.prefetch_used / self.prefetch_issued if self.prefetch_issued else None,
                "prefetch_recall": (self.prefetch_hits / (self.prefetch_hits + self.misses)
                                    if self.prefetch_hits + self.misses else None),
                "bytes_host": self.bytes_host, "bytes_disk": self.bytes_disk, "offload_wait_s": self.wait_s,
                "overflow_steps": self.overflow_steps, "prefetch_by_source": self.source_rows(),
                "demotions": self.demotions, "promotions": self.promotions}
