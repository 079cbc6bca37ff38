"""Verify steps (each sequence its last token and k draft tokens, causal among its own rows, over
its paged KV) through the fused decode layers (model/fused_decode.py, `GQAAttention.row_plan`)
against the unfused layers on the same step: hidden states and the logits of every row."""

import random

import pytest
import torch

from moetune.engine.model_runner import ModelRunner
from moetune.model.batch import StepKind
from moetune.model.fused_decode import FusedDecode
from moetune.model.loader import load_model
from tests.checkpoints import VOCAB, build_checkpoint

BLOCK = 4  # small blocks: the prompts and the verify rows cross block edges


@pytest.fixture(scope="module")
def odd_heads(tmp_path_factory):
    """qwen3_moe with 6 query heads over 3 kv heads (an odd kv head count) of head_dim 8."""
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("oddheads"), num_attention_heads=6,
                            num_key_value_heads=3, head_dim=8)


def _steps(model, lens: list[int], drafts: list[int], seed: int):
    """Prefill prompts of `lens` tokens, then one verify step (1 + drafts[i] rows for sequence i),
    once fused and once unfused on copies of the same cache → ((hidden [T, D], logits [T, V]) fused,
    the same unfused, the verify batch, whether the fused layers ran)."""
    rng = random.Random(seed)
    blocks = [-(-(n + 1 + k) // BLOCK) for n, k in zip(lens, drafts)]
    runner = ModelRunner(model, sum(blocks) + 1, BLOCK)
    tables, first = [], 1
    for b in blocks:
        tables.append(list(range(first, first + b)))
        first += b
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lens]
    runner.cache.zero_blocks(list(range(1, first)))
    model.forward(runner.build_batch([(p, 0, t) for p, t in zip(prompts, tables)], StepKind.PREFILL), runner.cache)
    spans = [([rng.randrange(3, VOCAB) for _ in range(1 + k)], n, t) for n, k, t in zip(lens, drafts, tables)]
    out, calls, keep, layer = {}, [], model.fused, FusedDecode._layer

    def counting(self, *args):
        calls.append(1)
        return layer(self, *args)

    FusedDecode._layer = counting
    pools = [(k.clone(), v.clone()) for k, v in runner.cache.layers]
    try:
        for fused in (True, False):
            runner.cache.layers = [(k.clone(), v.clone()) for k, v in pools]
            model.fused = keep if fused else None
            batch = runner.build_batch(spans, StepKind.DECODE)
            hidden = model.forward(batch, runner.cache)  # [T, D]
            out[fused] = (hidden, model.logits(hidden))
    finally:
        FusedDecode._layer, model.fused = layer, keep
    return out[True], out[False], batch, bool(calls)


def _assert_same(model, lens, drafts, seed=0):
    (h, logits), (h_ref, logits_ref), batch, fused = _steps(model, lens, drafts, seed)
    assert fused and batch.num_single < batch.input_ids.shape[0]
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, logits_ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(logits.argmax(-1), logits_ref.argmax(-1))


# (prompt lengths, drafts per sequence): k = 0..4 mixed, contexts ending on, before and after block edges
SHAPES = [([7], [1]), ([4], [4]), ([3, 9, 1, 12], [2, 0, 4, 3]), ([5, 8, 2], [4, 1, 0]), ([6, 11], [3, 4])]


@pytest.mark.parametrize("model_type", ["mixtral", "olmoe", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_a_verify_step_through_the_fused_layers_equals_the_unfused_ones(model_type, shape, checkpoint):
    """mixtral: sliding window 8 (contexts pass it); olmoe: q/k norm over the projection and clip;
    qwen2_moe: q/k/v bias, a gated shared expert, a dense layer (unfused) between fused ones;
    qwen3_moe: per-head q/k norm, top-3 of 7."""
    lens, drafts = SHAPES[shape]
    _assert_same(load_model(checkpoint(model_type)), lens, drafts, seed=shape)


def test_odd_head_counts(odd_heads):
    model = load_model(odd_heads)
    for i, (lens, drafts) in enumerate(SHAPES):
        _assert_same(model, lens, drafts, seed=i)


def test_a_step_with_prompt_rows_or_more_rows_than_max_rows_stays_unfused(checkpoint):
    model = load_model(checkpoint("qwen3_moe"))
    runner = ModelRunner(model, 8, BLOCK)
    mixed = runner.build_batch([([5, 6], 3, [1, 4]), ([7, 8, 9], 0, [2])], StepKind.MIXED)
    verify = runner.build_batch([([5, 6], 3, [1, 4]), ([7, 8, 9], 4, [2, 3])], StepKind.DECODE)
    assert not model.fused.takes(mixed) and model.fused.takes(verify)
    assert not FusedDecode(max_rows=4).takes(verify)
