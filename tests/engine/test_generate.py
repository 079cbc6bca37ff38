"""Generation API: ragged batches, sampling parameters, stop conditions."""

import pytest
import torch

from moetune.config import RunConfig
from moetune.engine.build import build_generator
from moetune.engine.sampling import SamplingParams, _top_p_filter
from moetune.errors import RequestError


@pytest.fixture(scope="module")
def gen(checkpoint):
    return build_generator(RunConfig(model={"path": str(checkpoint("qwen3_moe"))}))


PROMPTS = ["def add(a, b):", "import", "class Point:\n    x: int\n    y"]


def test_a_ragged_batch_equals_each_prompt_alone(gen):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    together = gen.generate(PROMPTS, params)
    for prompt, got in zip(PROMPTS, together):
        alone = gen.generate([prompt], params)[0]
        assert got.token_ids == alone.token_ids
        assert got.text == alone.text and len(got.token_ids) == 12 and got.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_seeds_differ(gen):
    p = dict(max_tokens=16, temperature=1.5, ignore_eos=True)
    a = gen.generate(PROMPTS, SamplingParams(seed=3, **p))
    b = gen.generate(PROMPTS, SamplingParams(seed=3, **p))
    c = gen.generate(PROMPTS, SamplingParams(seed=4, **p))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_top_k_one_and_tiny_top_p_are_greedy(gen):
    greedy = gen.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
    topk1 = gen.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.9, top_k=1, seed=1, ignore_eos=True))
    topp = gen.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.9, top_p=1e-6, seed=1, ignore_eos=True))
    assert [g.token_ids for g in greedy] == [t.token_ids for t in topk1] == [t.token_ids for t in topp]


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    torch.testing.assert_close(_top_p_filter(probs, 0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(_top_p_filter(probs, 0.5), torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_stop_string_truncates_and_streaming_never_shows_it(gen):
    free = gen.generate([PROMPTS[0]], SamplingParams(max_tokens=24, ignore_eos=True))[0].text
    assert len(free) > 4
    stop = free[2:4]
    cut = gen.generate([PROMPTS[0]], SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and cut.text == free[: free.find(stop)]
    streamed = "".join(gen.stream(PROMPTS[0], SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,))))
    assert streamed == cut.text


def test_eos_stops_unless_ignored(gen):
    eos = next(iter(gen.eos_ids))
    greedy = gen.generate([PROMPTS[1]], SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    gen.eos_ids = frozenset({greedy[2]})  # pretend the third greedy token is EOS
    try:
        stopped = gen.generate([PROMPTS[1]], SamplingParams(max_tokens=6))[0]
        ignored = gen.generate([PROMPTS[1]], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    finally:
        gen.eos_ids = frozenset({eos})
    assert stopped.finish_reason == "stop" and stopped.token_ids == greedy[:2]
    assert ignored.token_ids == greedy


def test_a_prompt_longer_than_the_context_is_a_request_error(gen):
    too_long = list(range(3, 3 + gen.model.spec.max_position))
    with pytest.raises(RequestError, match="context"):
        gen.generate([too_long], SamplingParams(max_tokens=1))


def test_generation_stops_at_the_context_end(gen):
    limit = gen.model.spec.max_position
    prompt = [5] * (limit - 3)
    out = gen.generate([prompt], SamplingParams(max_tokens=50, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-2)])
def test_bad_sampling_parameters_are_request_errors(bad):
    with pytest.raises(RequestError):
        SamplingParams(**bad)


def test_chat_template_comes_from_the_checkpoint_tokenizer(gen):
    from moetune.engine.tokenizer import apply_chat_template

    messages = [{"role": "user", "content": "hi"}]
    assert apply_chat_template(gen.tokenizer, messages) == "hi\n"  # no template: plain text
    gen.tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    try:
        assert apply_chat_template(gen.tokenizer, messages) == "<user>hi<assistant>"
    finally:
        gen.tokenizer.chat_template = None


def test_a_sequence_finishing_early_leaves_the_others_unchanged(gen):
    """The middle sequence stops first, so later decode steps read the cache through a slot gather."""
    params = [SamplingParams(max_tokens=10, ignore_eos=True), SamplingParams(max_tokens=2, ignore_eos=True),
              SamplingParams(max_tokens=10, ignore_eos=True)]
    together = gen.generate(PROMPTS, params)
    for prompt, p, got in zip(PROMPTS, params, together):
        assert got.token_ids == gen.generate([prompt], p)[0].token_ids
    assert [len(c.token_ids) for c in together] == [10, 2, 10]
