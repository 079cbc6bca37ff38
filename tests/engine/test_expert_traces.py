"""Per-sequence expert traces beside the KV blocks (engine/expert_trace.py) and the offload store's
history hints from them: traces are each token's routing, shared with prefix-cached blocks and
overwritten with reused blocks; history hints never change a token and are counted per source."""

import random

import numpy as np
import pytest

from moetune.config import EngineConfig
from moetune.engine.engine import Engine
from moetune.engine.routing import StepRouting
from moetune.engine.sampling import SamplingParams
from moetune.experts.offload import OffloadingExpertStore, OffloadSettings
from moetune.model.loader import load_model
from tests.checkpoints import VOCAB


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randint(5, 40))] for _ in range(n)]


def _generate(engine: Engine, prompts, max_tokens: int = 8) -> list[list[int]]:
    rids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    tokens = {rid: [] for rid in rids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].append(out.new_token)
    return [tokens[rid] for rid in rids]


def _alone_routing(model, prompt: list[int]) -> np.ndarray:
    """[n, Lm, K] the prompt's routing in a prefill of its own."""
    routing = StepRouting(model)
    routing.attach()
    try:
        routing.begin()
        Engine(model, None, frozenset()).runner.forward_prompts([prompt])
        return routing.finish([len(prompt)]).ids.numpy()
    finally:
        routing.detach()


def test_a_trace_is_each_tokens_routing_and_comes_with_prefix_cached_blocks(checkpoint):
    model = load_model(checkpoint("qwen3_moe", shard=False))
    engine = Engine(model, None, frozenset(), EngineConfig(block_size=4, num_kv_blocks=64))
    engine.keep_traces()
    shared = _prompts(1, seed=4)[0][:16]  # four full blocks
    first, second = shared + [5, 6, 7], shared + [9, 10]
    rid = engine.add_request(first, SamplingParams(max_tokens=2, ignore_eos=True))
    seq = engine.sequence(rid)
    engine.step()
    got = engine.traces.read(seq, 0, len(first))  # [n, Lm, K]
    assert np.array_equal(np.sort(got, -1), np.sort(_alone_routing(model, first), -1))
    blocks = list(seq.block_table[:4])
    engine.step()  # the request finishes; its blocks are freed but keep their prefix keys
    rid = engine.add_request(second, SamplingParams(max_tokens=2, ignore_eos=True))
    seq2 = engine.sequence(rid)
    engine.step()
    assert seq2.num_cached_tokens == 16 and seq2.block_table[:4] == blocks  # the cached blocks, traces and all
    assert np.array_equal(engine.traces.read(seq2, 0, 16), got[:16])
    assert (engine.traces.read(seq2, 0, len(second)) >= 0).all()


def test_a_reused_block_gets_the_new_tokens_trace(checkpoint):
    model = load_model(checkpoint("qwen3_moe", shard=False))
    engine = Engine(model, None, frozenset(), EngineConfig(block_size=4, num_kv_blocks=8, prefix_caching=False))
    engine.keep_traces()
    for prompt in _prompts(3, seed=7):
        prompt = prompt[:20]
        rid = engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        seq = engine.sequence(rid)
        engine.step()  # the same few blocks every time
        want = _alone_routing(model, prompt)
        assert np.array_equal(np.sort(engine.traces.read(seq, 0, len(prompt)), -1), np.sort(want, -1))
        while engine.has_unfinished():
            engine.step()


@pytest.mark.parametrize("hints", ["router", "history", "both"])
def test_history_hints_never_change_tokens_and_are_counted_per_source(checkpoint, hints):
    path = checkpoint("qwen3_moe", shard=False)
    prompts = _prompts(6, seed=2)
    want = _generate(Engine(load_model(path), None, frozenset(), EngineConfig(max_num_seqs=3)), prompts, 12)
    settings = OffloadSettings(3, "lru", "host", None, 1, hints)  # 3 of 7 experts resident
    model = load_model(path, store_factory=lambda layers, spec: OffloadingExpertStore(
        layers, spec.moe.router.top_k, settings, "cpu"))
    engine = Engine(model, None, frozenset(), EngineConfig(max_num_seqs=3))
    assert (engine.traces is not None) == (hints != "router")
    got = _generate(engine, prompts, 12)
    model.experts.drain()
    assert got == want
    rows = [row["prefetch_by_source"] for row in model.experts.stats().values()]
    issued = {src: sum(r[src]["issued"] for r in rows) for src in ("router", "history")}
    if hints != "both":  # (under both, which source loads an expert first is the prefetch thread's timing)
        assert (issued["history"] > 0) == (hints == "history") and (issued["router"] > 0) == (hints == "router")
    assert issued["history"] + issued["router"] > 0
    for r in rows:
        for src in ("router", "history"):
            assert r[src]["used"] <= r[src]["issued"]
    model.experts.close()
