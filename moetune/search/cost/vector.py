"""Every lock-step of a schedule priced at once: the pieces `Simulator._price_step` prices one step
at a time (phase_costs.py), computed with numpy over the steps and ranks. The per-step loop stays
as the reference (`Simulator.reference = True`; tests/search/test_vector_price.py holds the two
equal within float rounding on several deployments).

What makes it fast:
- the trace rows a rank's tokens take are a window of a pool (prompt rows, decode rows) that
  starts where the previous rank's ended, so per-expert copies are differences of the pool's
  prefix counts (`PoolCounts`, kept across trials: they depend on the trace only);
- the expert slots' rows and active slots depend only on the step's copies over all ranks: priced
  once per distinct window (a steady state repeats windows: `np.unique`);
- copies sent from rank r to rank q are linear in the copies, so a prefix of each row's copies
  projected onto the ranks (through the placement's `to_rank`, kept per placement) gives them;
- the roofline pieces are elementwise: one call per group of steps of the same kind and launch.

Not vectorised (the loop prices them, `vector_reason`): a capacity limit (drop / buffer: per
source rank, nonlinear), an open-loop `rate` workload (steps depend on the clock), --explain, and
a pool too large for prefix counts. Sequential pieces stay loops over the steps inside: the
offload cache, the drafter's seconds and the TP collectives (a few calls per step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moetune.search.cost import phase_costs as costs

PREFIX_ELEMS = 32_000_000  # prefix counts kept per pool over it twice (int32: 128 MB at most)
CHUNK = 64  # distinct windows priced at once ([CHUNK, Lm, P] arrays)


def vector_reason(sim, d) -> str | None:
    """Why the vectorised pricing does not apply (the per-step loop prices it), or None."""
    m = sim.src.model
    if getattr(sim, "reference", False):
        return "reference pricing asked for"
    if sim.terms is not None:
        return "--explain notes each step's terms"
    if d.capacity_policy in ("drop", "buffer"):
        return "a capacity limit splits copies per source rank"
    pools = (sim.src.prefill_ids, sim.src.decode_ids)
    if any((2 * len(p) + 1) * m.Lm * m.E > PREFIX_ELEMS for p in pools):
        return "a pool too large for prefix counts"
    return None


class PoolCounts:
    """A pool's rows [N, Lm, K] as prefix counts: copies per expert of its first i rows [N + 1, Lm·E]
    (int32), and per placement the copies per destination rank [N + 1, Lm·R] (float)."""

    def __init__(self, pool: np.ndarray, Lm: int, E: int):
        self.pool, self.Lm, self.E, self.N = pool, Lm, E, len(pool)
        twice = np.concatenate([pool, pool])  # a window of fewer than N rows from a start < N ends before 2N
        flat = (np.arange(Lm)[None, :, None] * E + twice.astype(np.int64)).reshape(2 * self.N, -1)  # [2N, Lm·K]
        rows = np.zeros((2 * self.N + 1, Lm * E), dtype=np.int32)  # counts ≤ 2N·K: int32 halves the bytes read
        np.add.at(rows, (np.repeat(np.arange(1, 2 * self.N + 1), flat.shape[1]), flat.reshape(-1)), 1)
        self.prefix = np.cumsum(rows, axis=0, dtype=np.int32)  # [2N + 1, Lm·E]
        self._proj: dict = {}

    def projected(self, to_rank: np.ndarray) -> np.ndarray:
        """[2N + 1, Lm·R] copies sent to each rank by the pool's first i rows, cycling (to_rank [Lm, E, R])."""
        key = (to_rank.shape, hash(to_rank.tobytes()))
        if key not in self._proj:
            if len(self._proj) >= 8:
                self._proj.pop(next(iter(self._proj)))
            per_row = to_rank[np.arange(self.Lm)[None, :, None], self.pool.astype(np.int64)].sum(2)  # [N, Lm, R]
            flat = per_row.reshape(self.N, -1)
            out = np.zeros((2 * self.N + 1, flat.shape[1]))
            out[1:] = np.cumsum(np.concatenate([flat, flat]), axis=0)
            self._proj[key] = out
        return self._proj[key]

    def window(self, prefix: np.ndarray, start: np.ndarray, n: np.ndarray) -> np.ndarray:
        """[..., cols] of n rows from `start`, cycling (start, n: int arrays of one shape; prefix over
        the pool twice, [2N + 1, cols])."""
        N = self.N
        wraps, rem = np.divmod(n, N)
        s0 = start % N
        out = prefix[s0 + rem] - prefix[s0]
        if wraps.any():
            out = out + wraps[..., None] * prefix[N]
        return out


def pool_counts(sim, pool: np.ndarray) -> PoolCounts:
    """The pool's PoolCounts, kept on the simulator (its views share them)."""
    key = id(pool)
    if key not in sim.pool_cache:
        sim.pool_cache[key] = PoolCounts(pool, sim.src.model.Lm, sim.src.model.E)
    return sim.pool_cache[key]


@dataclass
class Windows:
    """Where each step's and each rank's rows come from: pool starts and row counts, [S, R]."""

    pre: PoolCounts
    dec: PoolCounts
    pre_start: np.ndarray
    dec_start: np.ndarray
    prefill: np.ndarray
    decode: np.ndarray

    @classmethod
    def of(cls, sim, s) -> "Windows":
        src = sim.src
        decode_pool = src.decode_ids if len(src.decode_ids) else src.prefill_ids
        pf, dc = s.prefill.astype(np.int64), s.decode.astype(np.int64)
        return cls(pool_counts(sim, src.prefill_ids), pool_counts(sim, decode_pool),
                   (np.cumsum(pf.reshape(-1)) - pf.reshape(-1)).reshape(pf.shape),
                   (np.cumsum(dc.reshape(-1)) - dc.reshape(-1)).reshape(dc.shape), pf, dc)

    def step_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct step windows [U, 4] (pre start, rows, dec start, rows) and each step's index [S]."""
        key = np.stack([self.pre_start[:, 0] % self.pre.N, self.prefill.sum(1),
                        self.dec_start[:, 0] % self.dec.N, self.decode.sum(1)], axis=1)
        uniq, inverse = np.unique(key, axis=0, return_inverse=True)
        return uniq, inverse.reshape(-1)

    def totals(self, keys: np.ndarray) -> np.ndarray:
        """[U, Lm, E] copies per expert of each step window (every rank's rows)."""
        out = (self.pre.window(self.pre.prefix, keys[:, 0], keys[:, 1])
               + self.dec.window(self.dec.prefix, keys[:, 2], keys[:, 3]))
        return out.reshape(len(keys), self.pre.Lm, self.pre.E)

    def sent(self, to_rank: np.ndarray, plain: bool = False) -> np.ndarray:
        """[S, R, Lm, R] copies rank r sends to rank q in each step (to_rank [Lm, E, R]): each pool's
        windows priced once per distinct (start, rows), where the rank takes rows from it; compiled
        (slots_fast.py) unless `plain` (this numpy reference)."""
        S, R = self.prefill.shape
        if not plain:
            from moetune.search.cost.slots_fast import sent_sums

            return sent_sums(self, to_rank).reshape(S, R, self.pre.Lm, to_rank.shape[2])
        out = np.zeros((S, R, self.pre.Lm * to_rank.shape[2]))
        for pool, start, n in ((self.pre, self.pre_start, self.prefill), (self.dec, self.dec_start, self.decode)):
            taking = n > 0
            if taking.any():
                keys, inv = np.unique(np.stack([start[taking] % pool.N, n[taking]], axis=1), axis=0,
                                      return_inverse=True)
                out[taking] += pool.window(pool.projected(to_rank), keys[:, 0], keys[:, 1])[inv.reshape(-1)]
        return out.reshape(S, R, self.pre.Lm, to_rank.shape[2])


@dataclass
class Slots:
    """SlotRows' per-rank sums over every step ([S, Lm, R]) and the low / all copies per step [S]."""

    rows_q: np.ndarray
    act_bytes_q: np.ndarray
    act_n_q: np.ndarray
    fp8_rows_q: np.ndarray
    low: np.ndarray
    all: np.ndarray
    low_rows_q: np.ndarray  # [S, Lm, R] of rows_q, those on low-format slots (op_tables: a mixed expert op)


def slots_of(win: Windows, prep, R: int, halves: int, keep_active: bool = False, plain: bool = False):
    """Each step's SlotRows sums (priced once per distinct window), and with keep_active each step's
    active slots [S, Lm, P] (the offload caches read them), else None. Without keep_active, compiled in
    one pass (slots_fast.py) unless `plain` (this numpy reference)."""
    keys, inv = win.step_keys()
    if not keep_active and not plain:
        from moetune.search.cost.slots_fast import slot_sums

        return Slots(*(p[inv] for p in slot_sums(win, keys, prep, R, halves))), None
    U, Lm = len(keys), win.pre.Lm
    parts = [np.zeros((U, Lm, R)) for _ in range(4)] + [np.zeros(U), np.zeros(U), np.zeros((U, Lm, R))]
    active = np.zeros((U,) + prep.phy2log.shape, dtype=bool) if keep_active else None
    fp8_any = bool(prep.fp8_slot.any())
    for lo in range(0, U, CHUNK):
        total = win.totals(keys[lo: lo + CHUNK]) / halves  # [c, Lm, E]
        slot_counts = np.take_along_axis(total, np.broadcast_to(prep.phy2log, total.shape[:1] + prep.phy2log.shape),
                                         axis=2)  # [c, Lm, P]
        on = slot_counts > prep.replica_idx  # SlotRows.of_total's fields, only the sums priced
        slot_rows = slot_counts / prep.reps_slot
        sums = (costs.per_rank(slot_rows, R), costs.per_rank(on * prep.slot_bytes, R), costs.per_rank(on, R),
                costs.per_rank(slot_rows * prep.fp8_slot, R) if fp8_any else 0.0)
        for out, v in zip(parts, sums):
            out[lo: lo + CHUNK] = v
        parts[6][lo: lo + CHUNK] = costs.per_rank(slot_rows * prep.low_share_slot, R)
        parts[4][lo: lo + CHUNK] = parts[6][lo: lo + CHUNK].sum((1, 2))
        parts[5][lo: lo + CHUNK] = parts[0][lo: lo + CHUNK].sum((1, 2))
        if keep_active:
            active[lo: lo + CHUNK] = on
    return Slots(*(p[inv] for p in parts)), (None if active is None else active[inv])


def all_to_all(sim, sent: np.ndarray, links: costs.Links, latency: np.ndarray) -> costs.AllToAll:
    """phase_costs.all_to_all over every step: sent [S, R, Lm, R] copies r → q, latency [S]; the
    AllToAll's seconds are [S, Lm], its bytes [S]."""
    m, b, hw = sim.src.model, sim.b, sim.hw
    S, R = sent.shape[:2]
    if R == 1:
        none = np.zeros((S, m.Lm))
        return costs.AllToAll(none, none, np.zeros(S), np.zeros(S))
    row_bytes = m.D * b
    same, other = links.same_node.astype(np.float64), links.other_node.astype(np.float64)  # [R, R]
    intra = np.einsum("srjq,rq->srj", sent, same) * row_bytes  # [S, R, Lm] sent in node
    inter = np.einsum("srjq,rq->srj", sent, other) * row_bytes
    intra_in = np.einsum("srjq,rq->sqj", sent, same) * row_bytes  # [S, R, Lm] received
    inter_in = np.einsum("srjq,rq->sqj", sent, other) * row_bytes
    link = (np.maximum(intra, intra_in) / (hw.intra_bw * hw.link_eff)
            + np.maximum(inter, inter_in) / (hw.inter_bw * hw.link_eff))  # [S, R, Lm]
    a2a = link.max(1) + costs.CALLS["dispatch"][0] * hw.op_overhead_s  # [S, Lm]
    lat = latency[:, None]
    return costs.AllToAll(a2a + 2 * lat, a2a + lat, 2 * (intra + inter).sum((1, 2)), 2 * inter.sum((1, 2)))


def half(st: costs.StepRows) -> costs.StepRows:
    """One of two micro-batches (StepRows.half over every step)."""
    return st.half()
