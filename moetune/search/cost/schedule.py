"""The engine's scheduling replayed without a model: which tokens each rank computes in each
lock-step, given the knobs `max_num_seqs` / `max_num_batched_tokens`.

Same policy as `moetune.engine.scheduler` (running sequences first: a decode takes one token, a
prompt in prefill takes what is left of the budget; then waiting requests are admitted in order
while budget and sequence slots last, a long prompt chunked), with data-parallel attention across
R ranks (request i on rank i mod R, `engine/distributed.py`), all ranks stepping together until
none has work. KV blocks are assumed sufficient (no preemption); the memory rule prices the KV
cache the knobs need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SimWorkload:
    prompt_lens: tuple[int, ...]  # one per request
    output_len: int

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)


@dataclass
class Schedule:
    prefill: np.ndarray  # [S, R] prompt tokens computed
    decode: np.ndarray  # [S, R] decode tokens computed
    pairs: np.ndarray  # [S, R] attention (query, key) pairs
    context: np.ndarray  # [S, R] KV tokens read (Σ over scheduled sequences of their context)
    sampled: np.ndarray  # [S, R] tokens sampled (decodes + prompts that finished prefill)
    seqs: np.ndarray  # [S, R] sequences scheduled
    first_step: np.ndarray  # [n] step that sampled each request's first token
    last_step: np.ndarray  # [n] step that sampled its last token

    @property
    def num_steps(self) -> int:
        return self.prefill.shape[0]


def simulate_schedule(w: SimWorkload, ranks: int, max_num_seqs: int, max_num_batched_tokens: int,
                      chunked_prefill: bool = True) -> Schedule:
    n = w.num_requests
    computed = np.zeros(n, dtype=np.int64)  # tokens in the KV cache
    generated = np.zeros(n, dtype=np.int64)
    first, last = np.full(n, -1), np.full(n, -1)
    waiting = [list(range(r, n, ranks)) for r in range(ranks)]
    running: list[list[int]] = [[] for _ in range(ranks)]
    rows: list[list[tuple]] = []
    step = 0
    while any(waiting[r] or running[r] for r in range(ranks)):
        row = []
        for r in range(ranks):
            row.append(_rank_step(r, w, computed, generated, first, last, waiting[r], running[r], step,
                                  max_num_seqs, max_num_batched_tokens, chunked_prefill))
        rows.append(row)
        step += 1
        if step > 10_000_000:  # a bug guard: every step makes progress by construction
            raise RuntimeError("schedule did not finish")
    a = np.array(rows, dtype=np.int64).reshape(step, ranks, 6)
    return Schedule(a[..., 0], a[..., 1], a[..., 2], a[..., 3], a[..., 4], a[..., 5], first, last)


def _rank_step(r, w, computed, generated, first, last, waiting, running, step, max_seqs, budget, chunked):
    prefill = decode = pairs = context = sampled = 0
    scheduled = []
    for i in list(running):
        if budget == 0:
            break
        prompt = w.prompt_lens[i]
        if computed[i] < prompt:  # still in prefill
            take = min(prompt - computed[i], budget)
            prefill += take
        else:
            take = 1
            decode += 1
        pairs += take * computed[i] + take * (take + 1) // 2
        context += computed[i] + take
        budget -= take
        scheduled.append((i, take))
    while waiting and budget > 0 and len(running) < max_seqs:
        i = waiting[0]
        take = min(w.prompt_lens[i], budget)
        if not chunked and take < w.prompt_lens[i]:
            break
        waiting.pop(0)
        running.append(i)
        prefill += take
        pairs += take * (take + 1) // 2
        context += take
        budget -= take
        scheduled.append((i, take))
    for i, take in scheduled:
        computed[i] += take
        if computed[i] >= w.prompt_lens[i]:  # prompt done (this step or earlier): a token is sampled
            generated[i] += 1
            sampled += 1
            if generated[i] == 1:
                first[i] = step
            if generated[i] >= w.output_len:
                last[i] = step
                running.remove(i)
    return prefill, decode, pairs, context, sampled, len(scheduled)
