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
    from moetune.search.cost.schedule import first_arrivals

    plen = np.asarray(w.prompt_lens, dtype=np.int64)
    return _compiled()(plen, int(w.output_len), ranks, max_num_seqs, max_num_batched_tokens, chunked,
                       first_arrivals(w, ranks), w.stop_after)


def _compiled():
    """_run compiled, with the helpers it calls compiled first (numba resolves them as globals)."""
    if "run" not in _COMPILED:
        import numba

        module = globals()
        for name in ("_remove", "_admit", "_rank_step"):
            module[name] = numba.njit(cache=True)(module[name])
        _COMPILED["run"] = numba.njit(cache=True)(_run)
    return _COMPILED["run"]


def _run(plen, output_len, R, max_seqs, budget0, chunked, due, stop):  # pragma: no cover - compiled by numba
    n, cap = len(plen), len(due)  # due: [cap] the step each of the first wave joins (schedule.first_arrivals)
    computed, generated = np.zeros(n, np.int64), np.zeros(n, np.int64)
    first, last, arrive = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    wait = np.zeros((R, n // R + 2), np.int64)  # each rank's waiting FIFO
    w_head, w_tail = np.zeros(R, np.int64), np.zeros(R, np.int64)
    run = np.zeros((R, max(max_seqs, 1) + 1), np.int64)  # each rank's running list, in order
    n_run = np.zeros(R, np.int64)
    scratch = np.zeros((2, max(max_seqs, 1) + n + 1), np.int64)  # the step's (request, tokens) scheduled
    rows = np.zeros((1024, R, 8), np.int64)
    done = np.zeros(2, np.int64)  # requests finished so far; of them, those before `stop` (the schedule's end)
    k, nxt, steps = 0, cap, 0  # first-wave requests joined; the next replacement's id
    while k < cap and due[k] == 0:
        _admit(wait, w_tail, k, R)
        arrive[k] = 0
        k += 1
    while ((w_tail > w_head).any() or (n_run > 0).any() or k < cap) and done[1] < stop:
        if not ((w_tail > w_head).any() or (n_run > 0).any()):  # nothing runs: the next of the first wave joins now
            _admit(wait, w_tail, k, R)
            arrive[k] = steps
            k += 1
        if steps == len(rows):
            grown = np.zeros((2 * len(rows), R, 8), np.int64)
            grown[:steps] = rows
            rows = grown
        before = done[0]
        for r in range(R):
            _rank_step(r, steps, rows, plen, output_len, max_seqs, budget0, chunked, computed, generated, first,
                       last, wait, w_head, w_tail, run, n_run, scratch, done, stop)
        if rows[steps, :, 5].sum() == 0:  # nothing scheduled: no step ever will be (Replay's guard, at once)
            raise RuntimeError("schedule did not finish")
        steps += 1
        if done[1] >= stop:  # the schedule ends here: no one joins after its last step
            break
        while k < cap and due[k] <= steps:  # the first wave, staggered
            _admit(wait, w_tail, k, R)
            arrive[k] = steps
            k += 1
        for _ in range(min(done[0] - before, n - nxt)):  # closed loop: each finished request is replaced
            _admit(wait, w_tail, nxt, R)
            arrive[nxt] = steps
            nxt += 1
    return rows[:steps], first, last, arrive


def _admit(wait, w_tail, i, R):  # pragma: no cover - compiled by numba
    """Request i joins its rank's waiting queue (rank i mod R)."""
    r = i % R
    wait[r, w_tail[r]] = i
    w_tail[r] += 1


def _remove(run, n_run, r, i):  # pragma: no cover - compiled by numba
    """Request i leaves rank r's running list (the others keep their order)."""
    m = n_run[r]
    for j in range(m):
        if run[r, j] == i:
            for q in range(j, m - 1):
                run[r, q] = run[r, q + 1]
            n_run[r] = m - 1
            return


def _rank_step(r, step, rows, plen, output_len, max_seqs, budget, chunked, computed, generated, first, last, wait,
               w_head, w_tail, run, n_run, scratch, done, stop):  # pragma: no cover - compiled by numba
    """schedule._rank_step on arrays: rank r's row of the step (rows[step, r])."""
    prefill = decode = ns = 0
    for i in run[r, :n_run[r]].copy():  # running sequences first: a decode one token, a prompt what fits
        if budget == 0:
            break
        take = min(plen[i] - computed[i], budget) if computed[i] < plen[i] else 1
        if computed[i] < plen[i]:
            prefill += take
        else:
            decode += 1
        budget -= take
        scratch[0, ns], scratch[1, ns] = i, take
        ns += 1
    while w_tail[r] > w_head[r] and budget > 0 and n_run[r] < max_seqs:  # then waiting requests, in order
        i = wait[r, w_head[r]]
        take = min(plen[i], budget)
        if not chunked and take < plen[i]:
            break
        w_head[r] += 1
        run[r, n_run[r]] = i
        n_run[r] += 1
        prefill += take
        budget -= take
        scratch[0, ns], scratch[1, ns] = i, take
        ns += 1
    pairs = context = sampled = 0
    for k in range(ns):
        i, take = scratch[0, k], scratch[1, k]
        pairs += take * computed[i] + take * (take + 1) // 2
        context += computed[i] + take
        computed[i] += take
        if computed[i] >= plen[i]:  # prompt done (this step or earlier): a token
            generated[i] += 1
            sampled += 1
            if generated[i] == 1:
                first[i] = step
            if generated[i] >= output_len:
                last[i] = step
                done[0] += 1
                if i < stop:
                    done[1] += 1
                _remove(run, n_run, r, i)
    out = rows[step, r]
    out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7] = (prefill, decode, pairs, context, sampled, ns,
                                                                      sampled, 0)


def compiled_schedule(w, ranks: int, max_num_seqs: int, max_num_batched_tokens: int, chunked: bool):
    """The Schedule `simulate_schedule` returns (no speculation), from `fast_schedule`."""
    from moetune.search.cost.schedule import Schedule

    rows, first, last, arrive = fast_schedule(w, ranks, max_num_seqs, max_num_batched_tokens, chunked)
    return Schedule(*(rows[..., k] for k in range(6)), first, last, arrive, rows[..., 6], rows[..., 7])
