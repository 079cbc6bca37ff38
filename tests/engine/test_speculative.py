"""Speculative decoding through Engine.step: greedy output is the tokens plain decoding gives,
token for token, while drafts are verified, accepted and rejected (their KV rolled back) under
continuous batching, chunked prefill, prefix caching and preemption.

On tiny random checkpoints (qwen3_moe: GQA; deepseek_v3: MLA's latent cache) and on the bundled
model. Prompts repeat a random phrase, so the n-gram speculator finds matches and drafts; random
models often answer in loops, so some drafts are accepted and many rejected.
"""

import json
import random

import pytest

from moetune.config import EngineConfig
from moetune.engine.engine import Engine
from moetune.engine.speculative.base import Draft
from moetune.engine.speculative.ngram import lookup
from moetune.model.loader import load_model
from moetune.model.registry import bundled_asset, resolve_model
from tests.checkpoints import VOCAB, build_checkpoint
from tests.engine.driving import all_free, greedy, mixed_requests, run_arrivals



def _plain_and_speculative(model, requests, speculative: str, **config):
    arrivals = [(i * 3) % 11 for i in range(len(requests))]
    plain = Engine(model, None, frozenset(), EngineConfig(**config))
    spec = Engine(model, None, frozenset(), EngineConfig(speculative=speculative, **config))
    return run_arrivals(plain, requests, arrivals), run_arrivals(spec, requests, arrivals), plain, spec


def test_ngram_greedy_equals_plain_decoding_with_chunks_prefix_hits_and_preemption(model):
    reqs = mixed_requests(24, VOCAB)
    # 48 blocks of 16 = 768 tokens for 24 requests of up to 396: preemption; a 64-token budget: chunks
    plain_out, spec_out, plain, spec = _plain_and_speculative(model, reqs, "ngram:4", max_num_batched_tokens=64,
                                                              num_kv_blocks=48, block_size=16)
    assert spec_out == plain_out
    st = spec.stats
    assert st.preemptions > 0 and st.steps["mixed"] > 0 and st.prefix_cache_hit_tokens > 0
    assert st.draft_tokens > 0 and 0 < st.accepted_tokens < st.draft_tokens  # accepted and rejected drafts
    assert sum(st.steps.values()) < sum(plain.stats.steps.values())  # accepted drafts saved steps
    assert all_free(spec) and all_free(plain)


class Wrong:
    """A speculator that guesses tokens the model rarely picks (and sometimes the right one):
    nearly every draft is rejected, so every verify step rolls KV back."""

    def __init__(self, k: int, truth: dict[tuple, int] | None = None):
        self.k, self.rng = k, random.Random(1)

    def propose(self, seqs, limits):
        return [Draft([self.rng.randrange(3, VOCAB) for _ in range(limit)]) for limit in limits]

    def accepted(self, seq, n):
        pass

    def forget(self, seq):
        pass


@pytest.mark.parametrize("k", [1, 7])
def test_rejected_drafts_leave_no_trace(model, k):
    """Drafts of random tokens, up to the sequence's length limit: the tokens are plain decoding's,
    every block comes back, and rejected positions' KV is overwritten before it is read."""
    reqs = mixed_requests(12, VOCAB, seed=3)
    plain = Engine(model, None, frozenset(), EngineConfig(max_num_batched_tokens=48, num_kv_blocks=40))
    spec = Engine(model, None, frozenset(), EngineConfig(max_num_batched_tokens=48, num_kv_blocks=40))
    spec.speculator = Wrong(k)
    arrivals = [i % 5 for i in range(12)]
    assert run_arrivals(spec, reqs, arrivals) == run_arrivals(plain, reqs, arrivals)
    assert spec.stats.draft_tokens > 0 and spec.stats.verified > 0
    assert all_free(spec)


def _three_decoding(model, **config) -> Engine:
    engine = Engine(model, None, frozenset(), EngineConfig(speculative="ngram:4", **config))
    engine.speculator = Wrong(4)
    for p in ([5, 6, 7], [8, 9], [10, 11, 12, 13]):
        engine.add_request(p, greedy(20))
    engine.step()  # the three prefills (9 tokens): each samples its first token
    engine.draft()
    return engine


def test_the_scheduler_budgets_lookahead_after_every_decode(model):
    sched = _three_decoding(model, max_num_batched_tokens=10).scheduler.schedule()
    # every decode gets its token (3), the 7 left go to the first drafts; one-token decodes lead the batch
    assert [(e.num_tokens, e.num_draft) for e in sched.entries] == [(1, 0), (5, 4), (4, 3)]
    assert sched.num_tokens == 10


def test_lookahead_is_cut_to_the_free_blocks_and_never_preempts(model):
    engine = _three_decoding(model, block_size=4, num_kv_blocks=6)  # 4 blocks held, 2 free
    sched = engine.scheduler.schedule()
    assert not sched.preempted and len(sched.entries) == 3 and engine.blocks.num_free == 0
    assert 0 < sum(e.num_draft for e in sched.entries) < 12  # drafts cut to what two blocks hold


def test_ngram_lookup_takes_the_latest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 3, 3) == [7, 5, 1]  # the latest 3-gram match
    assert lookup([4, 1, 2, 8, 2], 2, 3) == [8, 2]  # no 3- or 2-gram match: the last 1-gram
    assert lookup([4, 1, 2, 8, 2], 2, 3, min_ngram=2) == []  # 1-grams not asked for
    assert lookup([7, 1, 2, 9, 1, 2], 2, 3, min_ngram=2) == [9, 1]
    assert lookup([1, 2, 3], 4, 3) == []  # nothing repeats
    assert lookup([5, 5], 4, 3) == [5]  # stops at the known tokens
    assert lookup([1, 2, 1, 2], 0, 3) == []


@pytest.mark.parametrize("speculative", ["ngram:5", "draft:stdlib-moe:3", "mtp:2"])
def test_greedy_on_the_bundled_model_equals_plain_decoding(speculative):
    model = load_model(resolve_model(None))
    tok_path = bundled_asset("prompts/stdlib-heldout.jsonl")
    from moetune.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model(None))
    rows = [json.loads(line) for line in tok_path.read_text().splitlines()[:24]]
    rng = random.Random(0)
    reqs = [(tok.encode(r["prompt"])[:200], rng.randint(8, 48)) for r in rows]
    plain_out, spec_out, _, spec = _plain_and_speculative(model, reqs, speculative, max_num_batched_tokens=128,
                                                          num_kv_blocks=40, block_size=16)
    assert spec_out == plain_out
    st = spec.stats
    assert st.preemptions > 0 and st.accepted_tokens > 0
    if not speculative.startswith("draft"):  # (the model as its own draft: every draft may be accepted)
        assert st.accepted_tokens < st.draft_tokens
    if speculative.startswith("mtp"):  # the trained head: 70 % at k = 2 on the card's prompts
        assert st.acceptance_rate > 0.5
    assert all_free(spec)


def test_a_verify_step_counts_the_experts_it_wakes_against_a_plain_decode(model):
    """Batch 1: a plain decode routes one token, K distinct experts per MoE layer; the verify step
    wakes at least those and at most K per row. More sequences: never fewer than plain."""
    K, E = model.spec.moe.router.top_k, model.spec.moe.num_experts
    for batch in (1, 6):
        engine = Engine(model, None, frozenset(), EngineConfig(speculative="ngram:4"))
        engine.speculator = Wrong(4)
        for p, _ in mixed_requests(batch, VOCAB, seed=5):
            engine.add_request(p, greedy(12))
        while engine.has_unfinished():
            engine.step()
        ex = engine.runner.experts
        assert ex.steps == engine.stats.verify_steps > 0
        assert ex.layers == ex.steps * len(model.spec.moe_layers)
        if batch == 1:
            assert ex.plain == K * ex.layers
            assert K * ex.layers < ex.verify <= min(E, 5 * K) * ex.layers
        assert ex.plain <= ex.verify <= E * ex.layers


@pytest.fixture(scope="module")
def drafts(model, tmp_path_factory):
    """The target's own checkpoint again (seed 0: the same weights) and another random one of its
    type and vocabulary (seed 1: a poor draft)."""
    return {which: build_checkpoint(model.spec.model_type, tmp_path_factory.mktemp(which), shard=False, seed=seed,
                                    max_position_embeddings=512) for which, seed in (("itself", 0), ("another", 1))}


@pytest.mark.parametrize("which", ["itself", "another"])
def test_draft_model_greedy_equals_plain_decoding(model, drafts, which):
    """The target as its own draft: (nearly) every draft accepted; another random model: nearly
    every draft rejected. Either way plain decoding's tokens, with chunks and preemption."""
    draft_dir = drafts[which]
    reqs = mixed_requests(24, VOCAB)
    plain_out, spec_out, _, spec = _plain_and_speculative(model, reqs, f"draft:{draft_dir}:3",
                                                          max_num_batched_tokens=64, num_kv_blocks=40)
    assert spec_out == plain_out
    st = spec.stats
    assert st.draft_tokens > 0 and st.steps["mixed"] > 0
    assert st.acceptance_rate > 0.9 if which == "itself" else st.acceptance_rate < 0.2
    assert all_free(spec)
