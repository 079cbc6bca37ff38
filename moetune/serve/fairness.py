"""SlotGate: how many of the running slots one request, and one tenant, may hold.

The engine admits waiting sequences first come, first served, so a single request with `n=64`
took every running slot and a short request sent just after waited for one of its 64 sequences to
finish (63 s instead of 0.1 s). The engine's driver (serve/worker.py, serve/rank_worker.py) hands a
request's sequences to the engine through this gate: at most `request_cap` of one request's
sequences, and `tenant_caps[t]` of tenant t's, are in the engine (running or waiting there) at
once; the rest wait here, in arrival order, and go as the request's (or tenant's) earlier sequences
finish. A request whose head of line is blocked does not block those behind it.

The caps are fractions of the running slots (engine.max_num_seqs × ranks): serve.max_request_share
and serve.tenants.*.slot_share, rounded down, at least 1. Holding a sequence back never changes
its tokens (each choice keeps its seed, seed + i).

Runs on the driver's thread only.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from moetune.config import ServeConfig


def share_cap(share: float, slots: int) -> int:
    """At most `share` of `slots`, at least one."""
    return max(1, math.floor(share * slots + 1e-9))


class SlotGate:
    """The streams' sequences not yet in the engine, and how many each stream and tenant has there."""

    def __init__(self, request_cap: int | None = None, tenant_caps: dict[str, int] | None = None):
        self.request_cap = request_cap  # None: no cap
        self.tenant_caps = tenant_caps or {}
        self._next: OrderedDict[int, tuple[object, int]] = OrderedDict()  # id(stream) → (stream, next choice)
        self._held: dict[int, int] = {}  # id(stream) → its sequences in the engine
        self._tenant_held: dict[str, int] = {}
        self._stream_of: dict[int, object] = {}  # id(stream) → stream (kept: its id stays its own)
        self._changed = False  # since the last `take`: something offered or let go

    @classmethod
    def of(cls, serve: ServeConfig, slots: int) -> "SlotGate":
        """The gate of `moetune serve`: `slots` = engine.max_num_seqs × ranks (DP groups)."""
        tenants = {name: share_cap(t.slot_share, slots) for name, t in serve.tenants.items()
                   if t.slot_share is not None}
        return cls(share_cap(serve.max_request_share, slots), tenants)

    @property
    def pending(self) -> int:
        """Sequences held back here."""
        return sum(len(stream.prompts) - i for stream, i in self._next.values())

    def streams(self) -> list:
        """Every stream with sequences held back here."""
        return [stream for stream, _ in self._next.values()]

    def offer(self, stream) -> None:
        """A new request (its sequences checked): they go out through `take`."""
        key = id(stream)
        self._next[key] = (stream, 0)
        self._held[key] = 0
        self._stream_of[key] = stream
        self._changed = True

    def take(self) -> list[tuple[object, int]]:
        """(stream, choice index) to hand to the engine now, in arrival order within the caps."""
        out: list[tuple[object, int]] = []
        if not self._changed:
            return out
        self._changed = False
        for key, (stream, i) in list(self._next.items()):
            tenant = stream.tenant
            room = len(stream.prompts) - i
            if self.request_cap is not None:
                room = min(room, self.request_cap - self._held[key])
            cap = self.tenant_caps.get(tenant)
            if cap is not None:
                room = min(room, cap - self._tenant_held.get(tenant, 0))
            if room <= 0:
                continue
            out += [(stream, j) for j in range(i, i + room)]
            self._held[key] += room
            self._tenant_held[tenant] = self._tenant_held.get(tenant, 0) + room
            if i + room == len(stream.prompts):
                del self._next[key]
            else:
                self._next[key] = (stream, i + room)
        return out

    def finished(self, stream) -> None:
        """One of the stream's sequences left the engine (finished or aborted alone)."""
        key = id(stream)
        if self._held.get(key, 0) <= 0:
            return
        self._held[key] -= 1
        self._tenant_held[self._stream_of[key].tenant] -= 1
        self._changed = True
        if self._held[key] == 0 and key not in self._next:
            self._drop(key)

    def forget(self, stream) -> None:
        """The stream is over (aborted, failed): what it held and what waits here is let go."""
        key = id(stream)
        if key in self._held:
            self._tenant_held[self._stream_of[key].tenant] -= self._held[key]
            self._next.pop(key, None)
            self._drop(key)
            self._changed = True

    def clear(self) -> None:
        self._next.clear()
        self._held.clear()
        self._tenant_held.clear()
        self._stream_of.clear()

    def _drop(self, key: int) -> None:
        del self._held[key]
        tenant = self._stream_of.pop(key).tenant
        if self._tenant_held.get(tenant) == 0:
            del self._tenant_held[tenant]
