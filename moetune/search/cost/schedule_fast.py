"""`schedule.simulate_schedule` compiled (numba): the same policy as `Replay` / `_rank_step` for a
`burst` or `concurrency` workload without speculation, on arrays instead of Python lists — each
rank's waiting queue a FIFO of request ids, its running list kept in admission order. `Replay`
stays the reference (and drives `rate` workloads and speculation); tests/search/test_vector_price.py
holds the two equal. Compiled on first use and cached on disk (numba cache=True).
"""

from __future__ import annotations

import numpy as np

_COMPILED = {}


def fast_schedule(w, ranks: int, max_num_seqs: int, max_num_batched_tokens: int, chunked: bool):
    """(rows [S, R, 8], first [n], last [n], arrive_step [n]) as Replay would record them."""
    if "run" not in _COMPILED:
        import numba

        _COMPILED["run"] = numba.njit(cache=True)(_run)
    n = w.num_requests
    cap = n if w.mode == "burst" else min(n, max(1, w.concurrency))
    plen = np.asarray(w.prompt_lens, dtype=np.int64)
    return _COMPILED["run"](plen, int(w.output_len), ranks, max_num_seqs, max_num_batched_tokens, chunked, cap)


def _run(plen, output_len, R, max_seqs, budget0, chunked, cap):  # pragma: no cover - compiled by numba
    n = len(plen)
    computed = np.zeros(n, np.int64)
    generated = np.zeros(n, np.int64)
    first, last, arrive = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    wait = np.zeros((R, n // R + 2), np.int64)  # each rank's waiting FIFO
    w_head, w_tail = np.zeros(R, np.int64), np.zeros(R, np.int64)
    run = np.zeros((R, max(max_seqs, 1) + 1), np.int64)  # each rank's running list, in order
    n_run = np.zeros(R, np.int64)
    sched_i = np.zeros(max(max_seqs, 1) + n + 1, np.int64)
    sched_t = np.zeros(max(max_seqs, 1) + n + 1, np.int64)
    rows = np.zeros((1024, R, 8), np.int64)
    arrived, steps, done = 0, 0, 0
    for i in range(cap):
        r = i % R
        wait[r, w_tail[r]] = i
        w_tail[r] += 1
        arrive[i] = 0
        arrived += 1
    while True:
        work = False
        for r in range(R):
            if w_tail[r] > w_head[r] or n_run[r] > 0:
                work = True
        if not work:
            break
        if steps == len(rows):
            grown = np.zeros((2 * len(rows), R, 8), np.int64)
            grown[:steps] = rows
            rows = grown
        before = done
        for r in range(R):
            budget = budget0
            prefill = decode = 0
            ns = 0
            snapshot = run[r, :n_run[r]].copy()
            for i in snapshot:
                if budget == 0:
                    break
                if computed[i] < plen[i]:
                    take = min(plen[i] - computed[i], budget)
                    prefill += take
                else:
                    take = 1
                    decode += 1
                budget -= take
                sched_i[ns], sched_t[ns] = i, take
                ns += 1
            while w_tail[r] > w_head[r] and budget > 0 and n_run[r] < max_seqs:
                i = wait[r, w_head[r]]
                take = min(plen[i], budget)
                if not chunked and take < plen[i]:
                    break
                w_head[r] += 1
                run[r, n_run[r]] = i
                n_run[r] += 1
                prefill += take
                budget -= take
                sched_i[ns], sched_t[ns] = i, take
                ns += 1
            pairs = context = sampled = logits = 0
            for k in range(ns):
                i, take = sched_i[k], sched_t[k]
                pairs += take * computed[i] + take * (take + 1) // 2
                context += computed[i] + take
                computed[i] += take
                if computed[i] >= plen[i]:
                    logits += 1
                    generated[i] += 1
                    sampled += 1
                    if generated[i] == 1:
                        first[i] = steps
                    if generated[i] >= output_len:
                        last[i] = steps
                        done += 1
                        m = n_run[r]
                        for j in range(m):
                            if run[r, j] == i:
                                for q in range(j, m - 1):
                                    run[r, q] = run[r, q + 1]
                                n_run[r] = m - 1
                                break
            rows[steps, r, 0], rows[steps, r, 1], rows[steps, r, 2], rows[steps, r, 3] = prefill, decode, pairs, context
            rows[steps, r, 4], rows[steps, r, 5], rows[steps, r, 6], rows[steps, r, 7] = sampled, ns, logits, 0
        if rows[steps, :, 5].sum() == 0:  # nothing scheduled: no step ever will be (Replay's guard, at once)
            raise RuntimeError("schedule did not finish")
        steps += 1
        for _ in range(min(done - before, n - arrived)):  # closed loop: each finished request is replaced
            i = arrived
            r = i % R
            wait[r, w_tail[r]] = i
            w_tail[r] += 1
            arrive[i] = steps
            arrived += 1
    return rows[:steps], first, last, arrive


def compiled_schedule(w, ranks: int, max_num_seqs: int, max_num_batched_tokens: int, chunked: bool):
    """The Schedule `simulate_schedule` returns (no speculation), from `fast_schedule`."""
    from moetune.search.cost.schedule import Schedule

    rows, first, last, arrive = fast_schedule(w, ranks, max_num_seqs, max_num_batched_tokens, chunked)
    return Schedule(*(rows[..., k] for k in range(6)), first, last, arrive, rows[..., 6], rows[..., 7])
