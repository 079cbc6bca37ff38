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

A closed loop is **staggered** (`SimWorkload.stagger`, the default): the first C requests join
spread over one request's decode, in rounds of one request per data-parallel rank (round g, requests
gR .. gR + R − 1, at step ⌊g·R·O / C⌋, O the output length; one joins at once when no rank has
work), so the loop reaches the desynchronised steady state a server at concurrency C runs in — on
each rank requests at every stage, a new prompt entering whenever one leaves — instead of C equal
requests that start, finish and re-enter together in waves (`stagger=False`, each measured request
then waits for its whole wave's prefill). The ranks stay in step with each other: their loads are
symmetric (a balanced router sends a replacement to the rank that freed a slot) and the engines run
the ranks in lock-step, so each round's prompts are prefilled in the same steps (docs/search.md says
what unaligned ranks would cost). The requests and their lengths are the same; only when the first
wave joins changes (`first_arrivals`).
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
    slo_percentile: float = 90.0  # the percentile of the steady window's requests the SLOs apply at
    find_load: bool = False  # the concurrency is found per deployment: the highest meeting the SLOs (slo_load.py)
    stagger: bool = True  # a closed loop's first C requests join spread over one output (module docstring)
    drain: bool = True  # False: a closed loop stops once every request before the last `warmup` has finished (the
    # drain's own steps set no steady figure; a load search's probes skip them)

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    @property
    def stop_after(self) -> int:
        """The requests (by index) whose finish ends the schedule: all of them, or those before the drain."""
        if self.drain or self.mode != "concurrency":
            return self.num_requests
        return self.num_requests - min(self.warmup, max(0, (self.num_requests - 1) // 2))

    @property
    def most_in_flight(self) -> int:
        """The most requests ever waiting or running on the replica (what max_num_seqs can use)."""
        if self.find_load:  # the load is found per deployment, up to every rank's max_num_seqs (slo_load.py)
            return self.num_requests
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
    logits: np.ndarray | None = None  # [S, R] rows through the LM head (None: the sampled tokens)
    drafting: np.ndarray | None = None  # [S, R] decoding sequences that verified a draft (speculation)

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
                 chunked_prefill: bool = True, spec=None):
        n = w.num_requests
        self.w, self.R, self.max_seqs, self.budget, self.chunked = w, ranks, max_num_seqs, max_num_batched_tokens, \
            chunked_prefill
        self.spec = spec  # speculative.SpecPlan or None: decodes verify drafts (`_lookahead`)
        self.credit = np.zeros(n)  # speculation: each sequence's expected tokens not yet emitted (< 1)
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
                          self.running[r], self.steps, self.max_seqs, self.budget, self.chunked, self.spec,
                          self.credit)
               for r in range(self.R)]
        self.rows.append(row)
        if self.steps > 10_000_000:  # a bug guard: every step makes progress by construction
            raise RuntimeError("schedule did not finish")
        return np.array(row, dtype=np.int64), int((self.last >= 0).sum()) - before

    def idle(self) -> None:
        """A step in which no rank has work (an open-loop gap until the next arrival)."""
        self.rows.append([(0,) * ROW] * self.R)

    def schedule(self) -> Schedule:
        S = self.steps
        a = np.array(self.rows, dtype=np.int64).reshape(S, self.R, ROW)
        return Schedule(a[..., 0], a[..., 1], a[..., 2], a[..., 3], a[..., 4], a[..., 5], self.first, self.last,
                        self.arrive_step, a[..., 6], a[..., 7])


def simulate_schedule(w: SimWorkload, ranks: int, max_num_seqs: int, max_num_batched_tokens: int,
                      chunked_prefill: bool = True, spec=None) -> Schedule:
    """The whole schedule of a `burst` or `concurrency` workload (a `rate` one is driven by the clock)."""
    if w.mode == "rate":
        raise ValueError("a rate workload's schedule depends on step times: Simulator.evaluate drives it")
    rp = Replay(w, ranks, max_num_seqs, max_num_batched_tokens, chunked_prefill, spec)
    n = w.num_requests
    due = first_arrivals(w, ranks)  # [cap] the step each of the first wave joins
    cap, k, nxt = len(due), 0, len(due)  # first-wave requests joined; the next replacement's id
    while k < cap and due[k] == 0:
        rp.arrive(k)
        k += 1
    stop = w.stop_after
    while rp.has_work() or k < cap:
        if not rp.has_work():  # nothing runs: the next of the first wave joins now
            rp.arrive(k)
            k += 1
        _, finished = rp.step()
        if (rp.last[:stop] >= 0).all():  # the schedule ends here: no one joins after its last step
            break
        while k < cap and due[k] <= rp.steps:  # the first wave, staggered
            rp.arrive(k)
            k += 1
        for _ in range(min(finished, n - nxt)):  # closed loop: each finished request is replaced
            rp.arrive(nxt)
            nxt += 1
    return rp.schedule()


def first_arrivals(w: SimWorkload, ranks: int = 1) -> np.ndarray:
    """[cap] the step each request of the first wave joins: all at 0 in a burst or an unstaggered loop;
    staggered at C per replica over R data-parallel ranks, the first wave's g-th round (requests gR ..
    gR + R − 1, one per rank) at ⌊g·R·O / C⌋: spread over one output of O tokens, each rank's
    requests at different stages, the ranks' prefills in the same steps (module docstring)."""
    cap = w.num_requests if w.mode == "burst" else min(w.num_requests, max(1, w.concurrency))
    if w.mode != "concurrency" or not w.stagger:
        return np.zeros(cap, dtype=np.int64)
    R = max(1, ranks)
    return np.arange(cap, dtype=np.int64) // R * R * max(1, w.output_len) // cap


ROW = 8  # a rank's step: prefill, decode rows, pairs, context, sampled, seqs, logits rows, drafting seqs


def _rank_step(r, w, computed, generated, first, last, waiting, running, step, max_seqs, budget, chunked,
               spec=None, credit=None):
    prefill = decode = 0
    scheduled = []  # [request, tokens computed, draft tokens verified]
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
        budget -= take
        scheduled.append([i, take, 0])
    while waiting and budget > 0 and len(running) < max_seqs:
        i = waiting[0]
        take = min(w.prompt_lens[i], budget)
        if not chunked and take < w.prompt_lens[i]:
            break
        waiting.pop(0)
        running.append(i)
        prefill += take
        budget -= take
        scheduled.append([i, take, 0])
    if spec is not None:
        decode += _lookahead(w, spec.k, computed, generated, scheduled, budget)
    pairs = context = sampled = logits = drafting = 0
    for i, take, j in scheduled:
        pairs += take * computed[i] + take * (take + 1) // 2
        context += computed[i] + take
        if j:  # a verify: the last token and the accepted drafts kept (speculative.py: expected tokens)
            credit[i] += spec.tokens(j)
            n = min(int(credit[i]), w.output_len - generated[i])
            credit[i] -= int(credit[i])
            computed[i] += n
            new, logits, drafting = n, logits + take, drafting + 1
        else:
            computed[i] += take
            new = 1 if computed[i] >= w.prompt_lens[i] else 0  # prompt done (this step or earlier): a token
            logits += new
        if new:
            generated[i] += new
            sampled += new
            if generated[i] == new:
                first[i] = step
            if generated[i] >= w.output_len:
                last[i] = step
                running.remove(i)
    return prefill, decode, pairs, context, sampled, len(scheduled), logits, drafting


def _lookahead(w, k: int, computed, generated, scheduled: list, budget: int) -> int:
    """Extend the decodes with draft tokens from the budget left, in order (the engine's scheduler:
    up to k each, fewer near the sequence's last token); returns the rows added."""
    added = 0
    for entry in scheduled:
        i, take, _ = entry
        if take != 1 or computed[i] < w.prompt_lens[i] or budget == 0:
            continue
        j = min(k, w.output_len - generated[i] - 1, budget)
        if j > 0:
            entry[1], entry[2] = 1 + j, j
            budget -= j
            added += j
    return added
