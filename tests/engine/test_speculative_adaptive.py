"""Adaptive k (`METHOD:K:auto`, engine/speculative/adaptive.py): k falls when drafts are rejected,
rises when they are accepted, shrinks with the batch when rows cost, and greedy output stays plain
decoding's."""

import pytest

from moetune.config import EngineConfig, parse_speculative
from moetune.engine.engine import Engine
from moetune.engine.speculative.adaptive import PROBE_EVERY, AdaptiveK
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
    assert run_arrivals(spec, reqs, arrivals) == want
    chosen, st = spec.adaptive.chosen, spec.stats
    late = sum(chosen.values()) // 2  # the steps after the estimate settled
    if right:
        assert st.accepted_tokens == st.draft_tokens > 0 and spec.adaptive.acceptance > 0.9
        assert chosen[4] >= late
    else:
        assert st.accepted_tokens == 0 < st.draft_tokens and spec.adaptive.acceptance < 0.1
        assert chosen[0] >= late
