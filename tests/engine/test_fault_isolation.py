"""A sequence whose sampling or stop check fails is finished alone; reset() after a failed step
gives a consistent, empty engine that generates what a fresh one does; the sampler is safe for any
finite temperature > 0 and top_p in (0, 1]."""

import math

import pytest
import torch

from moetune.engine.engine import Engine
from moetune.engine.sampling import SamplingParams, sample
from moetune.errors import RequestError
from moetune.model.loader import load_model
from tests.checkpoints import build_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("q"), shard=False,
                                       max_position_embeddings=512))


def _run(engine: Engine, rids: list[int]) -> dict[int, list]:
    outs: dict[int, list] = {r: [] for r in rids}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].append(out)
    return outs


def _greedy_alone(model, prompt, n):
    engine = Engine(model, None, frozenset())
    rid = engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    return [o.new_token for o in _run(engine, [rid])[rid]]


def test_a_failing_sequence_finishes_alone_and_the_others_match_their_solo_tokens(model):
    engine = Engine(model, None, frozenset())
    prompts = [[5, 6, 7], [9, 10, 11, 12], [20, 21]]
    rids = [engine.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
    victim = engine.add_request([30, 31], SamplingParams(max_tokens=8, temperature=1.0, seed=1, ignore_eos=True))
    first = engine.step()
    object.__setattr__(engine.sequence(victim).params, "temperature", math.nan)  # NaN logits in the next step
    outs = _run(engine, rids + [victim])
    for out in reversed(first):
        outs[out.request_id].insert(0, out)
    last = outs[victim][-1]
    assert last.finish_reason == "error" and last.new_token == -1 and "sampling failed" in last.error
    for rid, prompt in zip(rids, prompts):
        assert [o.new_token for o in outs[rid]] == _greedy_alone(model, prompt, 8)
    assert not any(engine.blocks.ref_counts[1:])  # every block given back, the failed sequence's too


def test_a_stop_check_that_raises_fails_only_its_sequence(model):
    engine = Engine(model, None, frozenset())
    ok = engine.add_request([5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
    bad = engine.add_request([7, 8], SamplingParams(max_tokens=4, ignore_eos=True))

    def boom(*args):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")

    engine.sequence(bad).append = boom
    outs = _run(engine, [ok, bad])
    assert outs[bad][-1].finish_reason == "error" and "stop check failed" in outs[bad][-1].error
    assert [o.new_token for o in outs[ok]] == _greedy_alone(model, [5, 6], 4)


def test_reset_after_a_failed_step_leaves_an_engine_like_a_fresh_one(model):
    engine = Engine(model, None, frozenset())
    for p in ([5, 6, 7], [8, 9]):
        engine.add_request(p, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()
    engine.reset()
    engine.self_check()
    assert not engine.has_unfinished() and engine.blocks.num_free == engine.blocks.num_blocks
    rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.new_token for o in _run(engine, [rid])[rid]] == _greedy_alone(model, [5, 6, 7], 6)


def test_self_check_raises_when_no_forward_can_run(model):
    engine = Engine(model, None, frozenset())
    engine.runner.cache = None
    with pytest.raises(AttributeError):
        engine.self_check()


@pytest.mark.parametrize("temperature,top_p", [(1e-300, 1.0), (1e-40, 1.0), (5e-324, 0.5), (1.0, 1e-300), (2.0, 1e-30)])
def test_extreme_temperature_and_top_p_sample_the_most_likely_token(temperature, top_p):
    logits = torch.randn(1000)
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=1)
    assert sample(logits, params, torch.Generator().manual_seed(1)) == int(logits.argmax())


def test_seeds_outside_64_bits_and_non_finite_temperatures_are_request_errors():
    for bad in (dict(seed=2**63), dict(seed=-1), dict(temperature=math.inf), dict(temperature=math.nan)):
        with pytest.raises(RequestError):
            SamplingParams(**bad)
    SamplingParams(seed=2**63 - 1)
