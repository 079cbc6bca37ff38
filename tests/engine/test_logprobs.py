"""Logprobs of sampled tokens: from the logits the runner already computes, only for requests that ask."""

import pytest
import torch

from moetune.config import EngineConfig
from moetune.engine.engine import Engine
from moetune.engine.sampling import SamplingParams
from moetune.errors import RequestError
from moetune.model.loader import load_model
from tests.checkpoints import build_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("lp"), shard=False,
                                       max_position_embeddings=512))


def _outputs(engine: Engine) -> dict[int, list]:
    outs: dict[int, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    return outs


def test_greedy_logprobs_match_the_model_and_name_the_sampled_token(model):
    engine = Engine(model, None, frozenset(), EngineConfig())
    prompt = [5, 9, 14, 3, 7]
    asked = engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True, logprobs=3))
    plain = engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    outs = _outputs(engine)
    assert all(o.logprobs is None for o in outs[plain])
    tokens = [o.new_token for o in outs[asked]]
    assert tokens == [o.new_token for o in outs[plain]]
    for o in outs[asked]:
        lp = o.logprobs
        assert len(lp.top) == 3 and lp.top[0][0] == o.new_token and lp.logprob == pytest.approx(lp.top[0][1])
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True) and lp.logprob <= 0
    # the first token's logprob against a fresh forward of the prompt
    ref = Engine(model, None, frozenset(), EngineConfig())
    hidden = ref.runner.forward_prompts([prompt])  # [T, D]
    logp = torch.log_softmax(model.logits(hidden[-1:]).float(), -1)[0]  # [V]
    assert outs[asked][0].logprobs.logprob == pytest.approx(float(logp[tokens[0]]), abs=1e-4)


def test_sampled_tokens_get_their_own_logprob(model):
    engine = Engine(model, None, frozenset(), EngineConfig())
    rid = engine.add_request([4, 4, 8], SamplingParams(max_tokens=6, temperature=1.5, seed=3, ignore_eos=True,
                                                       logprobs=0))
    for o in _outputs(engine)[rid]:
        assert o.logprobs.top == [] and o.logprobs.logprob <= 0


def test_too_many_logprobs_is_a_request_error():
    with pytest.raises(RequestError, match="logprobs"):
        SamplingParams(logprobs=21)
