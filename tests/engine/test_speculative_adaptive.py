"""Adaptive k (`METHOD:K:auto`, engine/speculative/adaptive.py): k falls when drafts are rejected,
rises when they are accepted, shrinks with the batch when rows cost, falls to plain decoding when
verifying at all costs more than the accepted drafts save (measured by forced plain steps), and
greedy output stays plain decoding's. Step times come from a cost model through the `StepClock`
interface, never the wall clock, so every choice is deterministic."""

import random

import pytest

from moetune.config import EngineConfig, parse_speculative
from moetune.engine.engine import Engine
from moetune.engine.speculative.adaptive import PLAIN_EVERY, PROBE_EVERY, AdaptiveK
from moetune.engine.speculative.base import Draft
from tests.checkpoints import VOCAB
from tests.engine.driving import mixed_requests, run_arrivals


def test_the_auto_suffix_parses_after_k():
    assert parse_speculative("ngram:4:auto").adaptive and parse_speculative("ngram:4:auto").k == 4
    assert not parse_speculative("mtp:2").adaptive
    spec = parse_speculative("draft:/tmp/a:b:3:auto")
    assert (spec.method, spec.path, spec.k, spec.adaptive) == ("draft", "/tmp/a:b", 3, True)
    for bad in ("ngram:auto", "ngram:auto:4", "mtp:0:auto", "ngram:4:auto:auto"):
        with pytest.raises(ValueError, match="is not one of"):
            parse_speculative(bad)


def _after(verifies: list[tuple[int, int]], steps: int = 30) -> AdaptiveK:
    """An AdaptiveK (K = 4) that heard `verifies` (drafted, accepted) on each of `steps` steps,
    with steps timed as t(R) = 1 ms + 0.1 ms·R."""
    a = AdaptiveK(4)
    for i in range(steps):
        a.timed(1 + i % 5, 1e-3 + 1e-4 * (1 + i % 5))
        for drafted, accepted in verifies:
            a.heard(drafted, accepted)
        a.step_verified()
    return a


def test_k_follows_the_acceptance_and_the_batch():
    t0, t1 = _after([(4, 2)]).step_time()
    assert t0 == pytest.approx(1e-3, rel=1e-6) and t1 == pytest.approx(1e-4, rel=1e-6)
    assert _after([(4, 0)]).choose(1) == 0  # nothing accepted: plain decoding
    assert _after([(4, 4)]).choose(1) == 4  # everything: the bound
    mid = _after([(4, 2)])  # p ≈ 2/3
    assert 0 < mid.choose(1) and mid.choose(64) < mid.choose(1)  # rows cost more at batch 64


def test_k_zero_still_probes_one_draft_now_and_then():
    a = _after([(4, 0)])
    ks = [a.choose(1) for _ in range(2 * PROBE_EVERY)]
    assert ks.count(1) == 2 and ks.count(0) == 2 * PROBE_EVERY - 2


class CostClock:
    """A `StepClock` that reads a cost model, t = t0 + t1·rows (+ tv when the step verified drafts),
    in place of the wall clock."""

    def __init__(self, t0: float, t1: float, tv: float):
        self.t0, self.t1, self.tv = t0, t1, tv

    def start(self) -> None:
        pass

    def seconds(self, rows: int, verified: bool) -> float:
        return self.t0 + self.t1 * rows + self.tv * verified


class StallClock(CostClock):
    """CostClock whose first two steps and every 10th after take 100 ms more (a kernel compiled,
    the core taken by another process)."""

    def __init__(self, t0: float, t1: float, tv: float):
        super().__init__(t0, t1, tv)
        self.steps = 0

    def seconds(self, rows: int, verified: bool) -> float:
        self.steps += 1
        stalled = self.steps <= 2 or self.steps % 10 == 0
        return super().seconds(rows, verified) + 0.1 * stalled


def _simulate(p: float, clock: CostClock, batch: int = 1, steps: int = 400) -> AdaptiveK:
    """AdaptiveK (K = 4) driving `steps` decode steps of `batch` sequences whose drafts are each
    accepted with probability p until the first rejection (seeded), timed by `clock`."""
    a, rng = AdaptiveK(4, clock), random.Random(0)
    for _ in range(steps):
        k = a.choose(batch)
        a.step_began()
        for _ in range(batch if k else 0):
            kept = 0
            while kept < k and rng.random() < p:
                kept += 1
            a.heard(k, kept)
        if k:
            a.step_verified()
        a.step_ended(batch * (1 + k), k > 0)
    return a


def _late(a: AdaptiveK, steps: int = 400) -> list[int]:
    """The k the next `steps` choices take (the estimates settled), PLAIN_EVERY's forced plain steps
    and PROBE_EVERY's probes included."""
    return [a.choose(1) for _ in range(steps)]


def test_k_converges_to_zero_when_nothing_is_accepted_and_to_the_bound_when_everything_is():
    cheap = CostClock(1e-3, 1e-5, 1e-4)  # a memory-bound step: rows nearly free, verifying costs 10 %
    never, always = _late(_simulate(0.0, cheap)), _late(_simulate(1.0, cheap))
    assert never.count(0) == len(never) - len(never) // PROBE_EVERY  # plain, but for the probes
    assert always.count(4) == len(always) - len(always) // PLAIN_EVERY  # K, but for the measured plain steps


def test_a_fixed_cost_of_verifying_measured_by_plain_steps_turns_k_to_zero():
    """Half the drafts accepted: with verify steps as cheap as plain ones it drafts; when every verify
    step costs 3 ms more (a drafter, host-side verification), the forced plain steps measure the
    difference and it decodes plainly (a fit of verify steps alone would charge the 3 ms to k = 0
    too and keep drafting)."""
    free, dear = _simulate(0.5, CostClock(1e-3, 1e-5, 0.0)), _simulate(0.5, CostClock(1e-3, 1e-5, 3e-3))
    assert free.best(1) >= 2 and dear.best(1) == 0
    assert dear.verify.at(2) == pytest.approx(4.02e-3, rel=1e-3)  # its probes: one draft per step, 2 rows
    assert dear.plain.at(1) == pytest.approx(1.01e-3, rel=1e-3)  # a plain step measured: 1 ms + 1 row


@pytest.mark.parametrize("p, tv, want", [(1.0, 1e-4, 4), (0.0, 1e-4, 0), (0.5, 3e-3, 0), (0.7, 0.0, 4)])
def test_stalled_steps_do_not_move_k(p, tv, want):
    """Steps 100× their cost (the first two, then one in ten) are clipped to CLIP times the fit: the
    choice stays the unstalled one."""
    assert _simulate(p, CostClock(1e-3, 1e-5, tv)).best(1) == want
    assert _simulate(p, StallClock(1e-3, 1e-5, tv)).best(1) == want


def test_rows_that_cost_shrink_k_as_the_batch_grows():
    a = _simulate(0.7, CostClock(1e-3, 2e-4, 1e-4), batch=4)
    assert a.best(1) > a.best(16) and a.best(64) == 0


class Oracle:
    """Drafts plain decoding's own continuation of each request (right: every draft accepted) or
    that continuation with every token shifted by one (never accepted)."""

    def __init__(self, k: int, plain: dict[tuple, list[int]], right: bool):
        self.k, self.plain, self.right = k, plain, right

    def propose(self, seqs, limits):
        out = []
        for seq, limit in zip(seqs, limits):
            cont = self.plain[tuple(seq.prompt_ids)][len(seq.output_ids):][:limit]
            out.append(Draft(cont if self.right else [(t + 1) % VOCAB for t in cont]))
        return out

    def accepted(self, seq, n):
        pass

    def forget(self, seq):
        pass


@pytest.mark.parametrize("right", [False, True])
def test_an_engine_with_auto_k_moves_it_down_on_rejections_and_up_on_acceptance(model, right):
    reqs = [(p, 64) for p, _ in mixed_requests(6, VOCAB, seed=5)]
    arrivals = [0] * len(reqs)
    plain = Engine(model, None, frozenset(), EngineConfig(max_num_batched_tokens=512))
    want = run_arrivals(plain, reqs, arrivals)
    spec = Engine(model, None, frozenset(), EngineConfig(speculative="ngram:4:auto", max_num_batched_tokens=512))
    spec.speculator = Oracle(4, {tuple(p): w for (p, _), w in zip(reqs, want)}, right)
    spec.adaptive.clock = CostClock(1e-3, 1e-5, 1e-4)  # memory-bound steps, a verify costs 10 % more
    assert run_arrivals(spec, reqs, arrivals) == want
    chosen, st = spec.adaptive.chosen, spec.stats
    late = sum(chosen.values()) // 2  # the steps after the estimate settled
    if right:
        assert st.accepted_tokens == st.draft_tokens > 0 and spec.adaptive.acceptance > 0.9
        assert chosen[4] >= late
    else:
        assert st.accepted_tokens == 0 < st.draft_tokens and spec.adaptive.acceptance < 0.1
        assert chosen[0] >= late
