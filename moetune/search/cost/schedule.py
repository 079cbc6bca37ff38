"""The engine's scheduling replayed without a model: which tokens each rank computes in each
lock-step, given the knobs `max_num_seqs` / `max_num_batched_tokens`.

Same policy as `moetune.engine.scheduler` (running sequences first: a decode takes one token, a
prompt in prefill takes what is left of the budget; then waiting requests are admitted in order
while budget and sequence slots last, a long prompt chunked), with data-parallel attention across
R ranks (request i on rank i mod R, `engine/distributed.py`), all ranks stepping together until
none has work. KV blocks are assumed sufficient (no preemption); the memory rule prices the KV
cache the knobs need.

How requests arrive is the workload's `mode`: `burst` (every request waiting at step 0, the
original framing), `concurrency` (closed loop: C requests in flight per deployment replica, i.e.
over the R data-parallel ranks together; a request that finishes is replaced by the next one at
the following step) or `rate` (Poisson arrivals at R requests/s per replica; those need the step
times, so the simulator drives `Replay` step by step, `simulate.py`). `Replay` is the scheduler's
state; `simulate_schedule` runs it for the two modes whose arrivals do not depend on time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


MODES = ("burst", "concurrency", "rate")


@dataclass(frozen=True)
class SimWorkload:
    prompt_lens: tuple[int, ...]  # one per request
    output_len: int
    mode: str = "burst"  # burst | concurrency | rate (module docstring)
    concurrency: int = 0  # closed loop: requests in flight per deployment replica
    rate: float = 0.0  # Poisson arrivals: requests/s per deployment replica
    seed: int = 0  # of the Poisson arrivals
    warmup: int = 0  # requests excluded from the steady-state figures at the start (and as many at the end)
    slo_ttft_ms: float | None = None  # goodput: a request meets its SLOs when TTFT and TPOT are both within
    slo_tpot_ms: float | None = None

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    @property
    def most_in_flight(self) -> int:
        """The most requests ever waiting or running on the replica (what max_num_seqs can use)."""
        return min(self.num_requests, self.concurrency) if self.mode == "concurrency" else self.num_requests


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
    arrive_step: np.ndarray | None = None  # [n] first step each request could be scheduled in (None: all 0)

    @property
    def num_steps(self) -> int:
        return self.prefill.shape[0]

    def in_flight(self) -> np.ndarray:
        """[S] requests arrived and not finished during each step (waiting or running)."""
        steps = np.arange(self.num_steps)[:, None]  # [S, 1]
        arrive = self.arrive_step if self.arrive_step is not None else np.zeros_like(self.last_step)
        return ((arrive[None, :] <= steps) & (steps <= self.last_step[None, :])).sum(1)


class Replay:
    """The scheduler's state over R data-parallel ranks: `arrive(i, step)` queues request i on rank
    i mod R, `step()` schedules one lock-step on every rank ([R, 6] counts) and returns the requests
    that finished in it."""

    def __init__(self, w: SimWorkload, ranks: int, max_num_seqs: int, max_num_batched_tokens: int,
                 chunked_prefill: bool = True):
        n = w.num_requests
        self.w, self.R, self.max_seqs, self.budget, self.chunked = w, ranks, max_num_seqs, max_num_batched_tokens, \
            chunked_prefill
        self.computed = np.zeros(n, dtype=np.int64)  # tokens in the KV cache
        self.generated = np.zeros(n, dtype=np.int64)
        self.first, self.last, self.arrive_step = np.full(n, -1), np.full(n, -1), np.full(n, -1)
        self.waiting: list[list[int]] = [[] for _ in range(ranks)]
        self.running: list[list[int]] = [[] for _ in range(ranks)]
        self.rows: list[list[tuple]] = []
        self.arrived = 0

    @property
    def steps(self) -> int:
        return len(self.rows)

    def arrive(self, i: int) -> None:
        self.waiting[i % self.R].append(i)
        self.arrive_step[i] = self.steps
        self.arrived += 1

    def has_work(self) -> bool:
        return any(self.waiting[r] or self.running[r] for r in range(self.R))

    def step(self) -> tuple[np.ndarray, int]:
        """One lock-step: its [R, 6] counts and how many requests finished in it."""
        before = int((self.last >= 0).sum())
        row = [_rank_step(r, self.w, self.computed, self.generated, self.first, self.last, self.waiting[r],
                          self.running[r], self.steps, self.max_seqs, self.budget, self.chunked)
               for r in range(self.R)]
        self.rows.append(row)
        if self.steps > 10_000_000:  # a bug guard: every step makes progress by construction
            raise RuntimeError("schedule did not finish")
        return np.array(row, dtype=np.int64), int((self.last >= 0).sum()) - before

    def idle(self) -> None:
        """A step in which no rank has work (an open-loop gap until the next arrival)."""
        self.rows.append([(0,) * 6] * self.R)

    def schedule(self) -> Schedule:
        S = self.steps
        a = np.array(self.rows, dtype=np.int64).reshape(S, self.R, 6)
        return Schedule(a[..., 0], a[..., 1], a[..., 2], a[..., 3], a[..., 4], a[..., 5], self.first, self.last,
                        self.arrive_step)


def simulate_schedule(w: SimWorkload, ranks: int, max_num_seqs: int, max_num_batched_tokens: int,
                      chunked_prefill: bool = True) -> Schedule:
    """The whole schedule of a `burst` or `concurrency` workload (a `rate` one is driven by the clock)."""
    if w.mode == "rate":
        raise ValueError("a rate workload's schedule depends on step times: Simulator.evaluate drives it")
    rp = Replay(w, ranks, max_num_seqs, max_num_batched_tokens, chunked_prefill)
    n = w.num_requests
    cap = n if w.mode == "burst" else min(n, max(1, w.concurrency))
    for i in range(cap):
        rp.arrive(i)
    while rp.has_work():
        _, finished = rp.step()
        for _ in range(min(finished, n - rp.arrived)):  # closed loop: each finished request is replaced
            rp.arrive(rp.arrived)
    return rp.schedule()


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
