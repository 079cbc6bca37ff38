"""`vector.slots_of`'s sums and `Windows.sent` in compiled passes (numba): for each distinct step window,
the copies per expert (the difference of the pools' prefix counts, `vector.PoolCounts.window`) read
once and summed onto each rank's slots, with no [windows, Lm, P] temporaries; each rank's copies sent
to each rank read from the projected prefix rows directly. The numpy versions (`plain=True`) stay the
reference; tests/search/test_slot_sums.py holds them equal within float rounding (the sums' order
differs) on awkward shapes. Compiled on first use, cached on disk.

Per window u, MoE layer l and slot p (expert e = phy2log[l, p], on rank q = p // (P / R)):
  copies   c = (prefill window + decode window)[l, e] / halves
  rows_q[u, l, q]      += c / reps_slot[l, p]
  act_bytes_q[u, l, q] += slot_bytes[l, p]        where c > replica_idx[l, p] (the slot is active)
  act_n_q[u, l, q]     += 1                        where active
  fp8_rows_q[u, l, q]  += c / reps · fp8_slot[l, p]
  low_rows_q[u, l, q]  += c / reps · low_share_slot[l, p]   (rows on low-format slots: op_tables' mixed experts)
  low[u] += c / reps · low_share_slot[l, p];  all[u] += c / reps
"""

from __future__ import annotations

import numpy as np

_COMPILED: dict = {}


def slot_sums(win, keys: np.ndarray, prep, R: int, halves: int) -> list[np.ndarray]:
    """[rows_q, act_bytes_q, act_n_q, fp8_rows_q] ([U, Lm, R] each), low [U], all [U], low_rows_q [U, Lm, R]
    of the windows `keys` [U, 4] (vector.Windows.step_keys: prefill start, rows, decode start, rows)."""
    U, (Lm, P) = len(keys), prep.phy2log.shape
    out = [np.zeros((U, Lm, R)) for _ in range(4)] + [np.zeros(U), np.zeros(U), np.zeros((U, Lm, R))]
    if U:
        _kernel()(win.pre.prefix, win.pre.N, win.dec.prefix, win.dec.N, np.ascontiguousarray(keys, dtype=np.int64),
                  float(halves), win.pre.E, np.ascontiguousarray(prep.phy2log, dtype=np.int64),
                  *(np.ascontiguousarray(a, dtype=np.float64) for a in (prep.replica_idx, prep.reps_slot,
                                                                         prep.slot_bytes, prep.fp8_slot,
                                                                         prep.low_share_slot)), R, *out)
    return out


def _kernel():
    if "run" not in _COMPILED:
        import numba

        _COMPILED["run"] = numba.njit(cache=True, nogil=True)(_sums)
    return _COMPILED["run"]


def _sums(pre, pre_n, dec, dec_n, keys, halves, E, phy2log, replica_idx, reps, slot_bytes, fp8_slot, low_share,
          R, rows_q, bytes_q, n_q, fp8_q, low, all_, low_q):  # pragma: no cover - compiled by numba
    Lm, P = phy2log.shape
    per = P // R
    total = np.zeros(E)
    for u in range(keys.shape[0]):
        pw, pr = keys[u, 1] // pre_n, keys[u, 1] % pre_n
        ps = keys[u, 0] % pre_n
        dw, dr = keys[u, 3] // dec_n, keys[u, 3] % dec_n
        ds = keys[u, 2] % dec_n
        for j in range(Lm):
            base = j * E
            for e in range(E):
                col = base + e
                c = (np.int64(pre[ps + pr, col]) - np.int64(pre[ps, col]) + pw * np.int64(pre[pre_n, col])
                     + np.int64(dec[ds + dr, col]) - np.int64(dec[ds, col]) + dw * np.int64(dec[dec_n, col]))
                total[e] = c / halves
            for p in range(P):
                c = total[phy2log[j, p]]
                rows = c / reps[j, p]
                q = p // per
                rows_q[u, j, q] += rows
                fp8_q[u, j, q] += rows * fp8_slot[j, p]
                low_q[u, j, q] += rows * low_share[j, p]
                if c > replica_idx[j, p]:
                    bytes_q[u, j, q] += slot_bytes[j, p]
                    n_q[u, j, q] += 1.0
                low[u] += rows * low_share[j, p]
                all_[u] += rows


def sent_sums(win, to_rank: np.ndarray) -> np.ndarray:
    """[S, R, Lm·Q] copies each rank's rows of each step send to each rank (vector.Windows.sent, flat)."""
    S, R = win.prefill.shape
    pre, dec = win.pre.projected(to_rank), win.dec.projected(to_rank)
    out = np.zeros((S, R, pre.shape[1]))
    if "sent" not in _COMPILED:
        import numba

        _COMPILED["sent"] = numba.njit(cache=True, nogil=True)(_sent)
    _COMPILED["sent"](pre, win.pre.N, win.pre_start, win.prefill, dec, win.dec.N, win.dec_start, win.decode, out)
    return out


def _sent(pre, pre_n, pre_start, prefill, dec, dec_n, dec_start, decode, out):  # pragma: no cover - numba
    S, R = prefill.shape
    cols = pre.shape[1]
    for t in range(S):
        for r in range(R):
            for proj, n_pool, start, rows in ((pre, pre_n, pre_start, prefill), (dec, dec_n, dec_start, decode)):
                n = rows[t, r]
                if n > 0:
                    wraps, rem = n // n_pool, n % n_pool
                    s0 = start[t, r] % n_pool
                    for k in range(cols):
                        out[t, r, k] += proj[s0 + rem, k] - proj[s0, k] + wraps * proj[n_pool, k]
