"""offload.py's caches compiled (numba): one step of every (rank, MoE layer) cache at once, the
same policy as `OffloadState.step` / `SlotCache` (lru: least recently inserted or hit; lfu: fewest
uses, ties to the least recent), on arrays — resident [R, Lm, P], a stamp per insertion or hit,
uses per slot. `OffloadState` stays the reference (the per-step loop); tests/search/test_vector_price.py
holds the two equal. Compiled on first use and cached on disk (numba cache=True).
"""

from __future__ import annotations

import numpy as np

_COMPILED = {}


class FastOffload:
    """OffloadState's figures (needs, misses, fetched / wasted bytes) over arrays."""

    def __init__(self, capacity: int, eviction: str, depth: int, R: int, Lm: int, P: int):
        self.capacity, self.lfu, self.depth = capacity, eviction == "lfu", depth
        self.resident = np.zeros((R, Lm, P), np.bool_)
        self.stamp = np.zeros((R, Lm, P), np.int64)
        self.uses = np.zeros((R, Lm, P), np.int64)
        self.previous = np.zeros((R, Lm, P), np.bool_)  # the slots each cache needed in the step before
        self.counters = np.zeros(2, np.int64)  # needs, misses
        self.bytes = np.zeros(2)  # fetched, wasted
        self.clock = np.zeros(1, np.int64)

    @property
    def needs(self) -> int:
        return int(self.counters[0])

    @property
    def misses(self) -> int:
        return int(self.counters[1])

    @property
    def fetched_bytes(self) -> float:
        return float(self.bytes[0])

    @property
    def wasted_bytes(self) -> float:
        return float(self.bytes[1])

    def step(self, active: np.ndarray, slot_bytes: np.ndarray, host_bw: float, hidden_s: float,
             copy_bw: float) -> np.ndarray:
        """[Lm, R] stall seconds of one step (active [Lm, P]: the slots with rows; slot_bytes [Lm, P])."""
        return _compiled()(self.resident, self.stamp, self.uses, self.previous, self.counters, self.bytes,
                           self.clock, active, slot_bytes, self.capacity, self.lfu, self.depth, host_bw,
                           hidden_s, copy_bw)


def _compiled():
    """_step compiled, with the helpers it calls compiled first (numba resolves them as globals)."""
    if "step" not in _COMPILED:
        import numba

        module = globals()
        for name in ("_insert", "_touch"):
            module[name] = numba.njit(cache=True)(module[name])
        _COMPILED["step"] = numba.njit(cache=True)(_step)
    return _COMPILED["step"]


def _insert(res, stamp, uses, q, j, slot, cap, lfu, clock):  # pragma: no cover - compiled by numba
    if res[q, j, slot]:
        return
    if res[q, j].sum() >= cap:
        victim, best_u, best_s = -1, 0, 0
        for s in range(res.shape[2]):
            if res[q, j, s]:
                u = uses[q, j, s] if lfu else 0
                if victim < 0 or u < best_u or (u == best_u and stamp[q, j, s] < best_s):
                    victim, best_u, best_s = s, u, stamp[q, j, s]
        res[q, j, victim] = False
    res[q, j, slot] = True
    stamp[q, j, slot] = clock[0]
    clock[0] += 1


def _touch(res, stamp, uses, q, j, slot, cap, lfu, clock):  # pragma: no cover - compiled by numba
    uses[q, j, slot] += 1
    if res[q, j, slot]:
        stamp[q, j, slot] = clock[0]
        clock[0] += 1
        return True
    _insert(res, stamp, uses, q, j, slot, cap, lfu, clock)
    return False


def _step(res, stamp, uses, prev, counters, nbytes, clock, active, slot_bytes, cap, lfu, depth, host_bw,
          hidden_s, copy_bw):  # pragma: no cover - compiled by numba
    R, Lm, P = res.shape
    local = P // R
    stall = np.zeros((Lm, R))
    pre = np.zeros(P, np.bool_)
    for q in range(R):
        lo = q * local
        for j in range(Lm):
            need = active[j, lo: lo + local]
            n_need = need.sum()
            if n_need > cap:  # OffloadState._overflow: every needed slot through a transient buffer
                fetched = copied = 0.0
                for s in range(lo, lo + local):
                    if need[s - lo]:
                        if res[q, j, s]:
                            copied += slot_bytes[j, s]
                        else:
                            fetched += slot_bytes[j, s]
                            counters[1] += 1
                        uses[q, j, s] += 1
                counters[0] += n_need
                nbytes[0] += fetched
                stall[j, q] = fetched / host_bw + copied / copy_bw
                prev[q, j, lo: lo + local] = need
                continue
            pre[:] = False
            if depth > 0:
                for s in range(lo, lo + local):
                    if prev[q, j, s] and not res[q, j, s]:
                        _insert(res, stamp, uses, q, j, s, cap, lfu, clock)
                        pre[s] = True
                        nbytes[0] += slot_bytes[j, s]
            prev[q, j, lo: lo + local] = need
            stall_b = hidden_b = 0.0
            for s in range(lo, lo + local):
                if not need[s - lo]:
                    continue
                counters[0] += 1
                if pre[s]:
                    _touch(res, stamp, uses, q, j, s, cap, lfu, clock)
                    hidden_b += slot_bytes[j, s]
                    pre[s] = False
                elif not _touch(res, stamp, uses, q, j, s, cap, lfu, clock):
                    counters[1] += 1
                    stall_b += slot_bytes[j, s]
                    nbytes[0] += slot_bytes[j, s]
            for s in range(lo, lo + local):
                if pre[s]:
                    nbytes[1] += slot_bytes[j, s]
            stall[j, q] = stall_b / host_bw + max(0.0, hidden_b / host_bw - hidden_s)
    return stall
