"""moetune vs transformers on the same tiny random-init checkpoints: logits and greedy tokens."""

import pytest
import torch

from moetune.engine.generate import Generator
from moetune.engine.sampling import SamplingParams
from moetune.engine.model_runner import ModelRunner
from moetune.model.loader import load_model
from tests.conftest import MODEL_TYPES

PROMPT_LENS = [1, 7, 19, 12]


def _prompts(vocab: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen) for n in PROMPT_LENS]


def _moetune_logits(model, prompts):
    lens = [len(p) for p in prompts]
    runner = ModelRunner(model, num_blocks=sum(lens), block_size=4)
    return model.logits(runner.forward_prompts([p.tolist() for p in prompts])).split(lens)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_logits_match_transformers_on_a_ragged_batch(model_type, checkpoint, hf_model):
    path = checkpoint(model_type)
    ours = load_model(path)
    ref_model = hf_model(path)
    prompts = _prompts(ours.spec.vocab_size)
    for prompt, got in zip(prompts, _moetune_logits(ours, prompts)):
        with torch.no_grad():
            ref = ref_model(prompt[None]).logits[0]  # [S, V]
        err = (got - ref).abs().max().item()
        assert err <= 1e-4 * ref.abs().max().item(), f"{model_type}: max |Δlogit| {err:.3e}"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_short_prompts_through_the_cpu_kernels_match_transformers(model_type, checkpoint, hf_model):
    """Alone, a prompt of at most 16 tokens runs every projection, the experts and the LM head
    through the CPU decode kernels (the default on the CPU)."""
    path = checkpoint(model_type)
    ours = load_model(path)
    assert ours.small_m == 16
    ref_model = hf_model(path)
    for prompt in _prompts(ours.spec.vocab_size)[:3]:  # 1, 7 and 19 tokens: the last one through torch
        got = _moetune_logits(ours, [prompt])[0]
        with torch.no_grad():
            ref = ref_model(prompt[None]).logits[0]  # [S, V]
        err = (got - ref).abs().max().item()
        assert err <= 1e-4 * ref.abs().max().item(), f"{model_type} len {len(prompt)}: max |Δlogit| {err:.3e}"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_32_greedy_tokens_equal_transformers_generate(model_type, checkpoint, hf_model):
    path = checkpoint(model_type)
    ours = load_model(path)
    ref_model = hf_model(path)
    gen = Generator(ours, tokenizer=None, eos_ids=frozenset())  # no tokenizer: token ids only
    prompts = _prompts(ours.spec.vocab_size, seed=1)[1:]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    got = [c.token_ids for c in _generate_ids(gen, prompts, params)]
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            ref = ref_model.generate(prompt[None], max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                     attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        assert tokens == ref[0, len(prompt):].tolist(), model_type


def _generate_ids(gen: Generator, prompts, params):
    return gen.generate([p.tolist() for p in prompts], params)


def test_single_file_and_sharded_checkpoints_load_the_same(checkpoint):
    a, b = load_model(checkpoint("qwen3_moe", shard=False)), load_model(checkpoint("qwen3_moe", shard=True))
    prompts = _prompts(a.spec.vocab_size)
    for x, y in zip(_moetune_logits(a, prompts), _moetune_logits(b, prompts)):
        assert torch.equal(x, y)
    assert len(list(checkpoint("qwen3_moe").glob("*.safetensors"))) > 1
