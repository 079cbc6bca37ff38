"""The trace's rows handed to a simulated schedule: each step's prompt and decode tokens take the
next rows of the recorded routing, in order, cycling; copies per expert by prefix-count differences
(or a bincount where the prefix table would be too large)."""

from __future__ import annotations

import numpy as np

from moetune.search.cost.schedule import Schedule
from moetune.search.cost.source import TraceSource


class TraceRows:
    """The trace's rows handed out in recorded order, cycling: prompt tokens from the prefill rows,
    decode tokens from the decode rows (the prefill rows when the trace has none)."""

    def __init__(self, src: TraceSource):
        self.src, self.pre_cursor, self.dec_cursor = src, 0, 0
        self._prefix: dict[int, np.ndarray | None] = {}

    def peek(self, n: int, m) -> np.ndarray:
        """[Lm, E] copies per expert of the next n decode rows, the cursor left where it is."""
        decode = self.src.decode_ids if len(self.src.decode_ids) else self.src.prefill_ids
        return self._run(decode, self.dec_cursor, n, m) if n else np.zeros((m.Lm, m.E))

    def counts(self, s: Schedule, t: int, m) -> np.ndarray:
        """[R, Lm, E] copies per expert that each rank's tokens of step t send."""
        R = s.prefill.shape[1]
        counts = np.zeros((R, m.Lm, m.E))
        decode = self.src.decode_ids if len(self.src.decode_ids) else self.src.prefill_ids
        for r in range(R):
            p, dd = int(s.prefill[t, r]), int(s.decode[t, r])
            if p:
                counts[r] += self._run(self.src.prefill_ids, self.pre_cursor, p, m)
                self.pre_cursor += p
            if dd:
                counts[r] += self._run(decode, self.dec_cursor, dd, m)
                self.dec_cursor += dd
        return counts

    def _run(self, pool: np.ndarray, cursor: int, n: int, m) -> np.ndarray:
        """[Lm, E] copies per expert of n rows of `pool` from `cursor`, cycling: a difference of the
        pool's prefix counts where they fit PREFIX_ELEMS, else a bincount of the rows (same integers)."""
        prefix = self._prefix_of(pool, m)
        if prefix is None:
            return bincount(take(pool, cursor, n), m)
        N = len(pool)
        wraps, rem = divmod(n, N)
        start = cursor % N
        out = wraps * prefix[N] + (prefix[start + rem] - prefix[start] if start + rem <= N
                                   else prefix[N] - prefix[start] + prefix[start + rem - N])
        return out.reshape(m.Lm, m.E)

    def _prefix_of(self, pool: np.ndarray, m) -> np.ndarray | None:
        """[N + 1, Lm·E] copies per expert of the pool's first i rows (None: too large to keep)."""
        key = id(pool)
        if key not in self._prefix:
            N = len(pool)
            if (N + 1) * m.Lm * m.E > PREFIX_ELEMS:
                self._prefix[key] = None
            else:
                flat = (np.arange(m.Lm)[None, :, None] * m.E + pool.astype(np.int64)).reshape(N, -1)  # [N, Lm·K]
                rows = np.zeros((N + 1, m.Lm * m.E), dtype=np.int64)
                np.add.at(rows, (np.repeat(np.arange(1, N + 1), flat.shape[1]), flat.reshape(-1)), 1)
                self._prefix[key] = np.cumsum(rows, axis=0)
        return self._prefix[key]


PREFIX_ELEMS = 16_000_000  # prefix counts kept per pool (int64: 128 MB at most)


def bincount(ids: np.ndarray, m) -> np.ndarray:
    """[Lm, E] copies per expert of rows ids [T, Lm, K]."""
    flat = (np.arange(m.Lm)[None, :, None] * m.E + ids.astype(np.int64)).reshape(-1)
    return np.bincount(flat, minlength=m.Lm * m.E).reshape(m.Lm, m.E)


def take(pool: np.ndarray, cursor: int, n: int) -> np.ndarray:
    """n rows of `pool` from `cursor`, cycling."""
    N = len(pool)
    start = cursor % N
    if start + n <= N:
        return pool[start: start + n]
    idx = (start + np.arange(n)) % N
    return pool[idx]
