"""MTP speculation (engine/speculative/mtp.py) on tiny checkpoints with a random MTP layer in the
DeepSeek-V3 layout (tests/checkpoints.py: deepseek_v3 with its own shared_head.head and
embed_tokens, qwen3_moe with the target's tied ones): greedy output is plain decoding's under
chunked prefill, prefix hits and preemption; the drafts are what the module computes in one shot
over the final sequence (its KV bookkeeping through chunks, verify rollbacks and recomputation);
a checkpoint without the layer is refused by name."""


import pytest

from moetune.config import EngineConfig, parse_speculative
from moetune.engine.engine import Engine
from moetune.engine.model_runner import ModelRunner
from moetune.errors import CheckpointError
from moetune.model.batch import StepKind
from moetune.model.loader import load_model
from tests.checkpoints import VOCAB, build_checkpoint, build_mtp_checkpoint
from tests.engine.driving import all_free, mixed_requests, run_arrivals


@pytest.fixture(scope="module", params=["deepseek_v3", "qwen3_moe"])
def mtp_model(request, tmp_path_factory):
    path = build_mtp_checkpoint(request.param, tmp_path_factory.mktemp(request.param),
                                own_head=request.param == "deepseek_v3", max_position_embeddings=512)
    return load_model(path)


def test_mtp_parses():
    spec = parse_speculative("mtp:3")
    assert (spec.method, spec.k, spec.path) == ("mtp", 3, None)
    with pytest.raises(ValueError, match="mtp:K"):
        parse_speculative("mtp:0")


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_greedy_equals_plain_decoding_with_chunks_prefix_hits_and_preemption(mtp_model, k):
    reqs = mixed_requests(24, VOCAB)
    arrivals = [(i * 3) % 11 for i in range(24)]
    config = dict(max_num_batched_tokens=64, num_kv_blocks=48, block_size=16)  # 768 slots for 24 × ≤ 396: preempts
    plain = Engine(mtp_model, None, frozenset(), EngineConfig(**config))
    spec = Engine(mtp_model, None, frozenset(), EngineConfig(speculative=f"mtp:{k}", **config))
    assert run_arrivals(spec, reqs, arrivals) == run_arrivals(plain, reqs, arrivals)
    st = spec.stats
    assert st.preemptions > 0 and st.steps["mixed"] > 0 and st.prefix_cache_hit_tokens > 0
    assert st.verify_steps > 0 and st.draft_tokens > 0
    assert spec.speculator.forwards > 0 and not spec.speculator.drafts  # every finished sequence forgotten
    assert all_free(spec) and all_free(plain)


def _one_shot_drafts(model, module, tokens: list[int]) -> list[int]:
    """The module's greedy guess at every position p of `tokens` (for t_{p+2}), computed from one
    prefill of the target over all of them and one run of the module over all positions."""
    bs, n = 16, len(tokens)
    blocks = -(-n // bs) + 1
    runner = ModelRunner(model, blocks, bs)
    hidden = runner.forward_prompts([tokens])  # [n, D]
    cache = module.new_cache(blocks, bs)
    cache.zero_blocks(list(range(1, blocks + 1)))
    batch = runner.build_batch([(tokens[1:], 0, list(range(1, blocks + 1)))], StepKind.PREFILL)
    out = module.forward(batch.input_ids, hidden[:-1], batch, cache)  # [n - 1, D]
    return module.logits(out).argmax(-1).tolist()


def test_mtp_drafts_equal_the_module_run_once_over_the_final_sequence(mtp_model):
    """k = 1 without prefix caching (a cached block's last MTP slot belongs to the request that
    cached it): the draft offered at num_tokens = n is the module's guess at row n - 2 of a one-shot
    run over the sequence's final tokens, through chunks, verifies and recomputation."""
    reqs = mixed_requests(12, VOCAB, seed=2)
    engine = Engine(mtp_model, None, frozenset(), EngineConfig(speculative="mtp:1", max_num_batched_tokens=48,
                                                               num_kv_blocks=40, prefix_caching=False))
    offered, propose = [], engine.speculator.propose

    def recording(seqs, limits):
        drafts = propose(seqs, limits)
        offered.extend((s, s.num_tokens, d.tokens) for s, d in zip(seqs, drafts) if d.tokens)
        return drafts

    engine.speculator.propose = recording
    run_arrivals(engine, reqs, [i % 5 for i in range(12)])
    assert engine.stats.preemptions > 0 and engine.stats.steps["mixed"] > 0 and len(offered) > 20
    seqs = {s.seq_id: s for s, _, _ in offered}
    module = engine.speculator.module
    guesses = {i: _one_shot_drafts(mtp_model, module, s.token_ids(0, s.num_tokens)) for i, s in seqs.items()}
    assert all(tokens == [guesses[s.seq_id][n - 2]] for s, n, tokens in offered)


def test_a_checkpoint_without_an_mtp_layer_is_refused_by_name(tmp_path):
    model = load_model(build_checkpoint("qwen3_moe", tmp_path, shard=False))
    with pytest.raises(CheckpointError, match="num_nextn_predict_layers"):
        Engine(model, None, frozenset(), EngineConfig(speculative="mtp:2"))


def test_the_mtp_blocks_expert_reads_are_counted_with_the_verify_steps(mtp_model):
    """Every forward of the MTP module's MoE block adds the distinct experts its rows route to (as
    the layer's own routing tap hears them) and their bytes; the summary's verify-side bytes per
    step are the target's verify experts plus the drafter's, per verify step."""
    from moetune.engine.speculative.experts import speculative_counters, speculative_summary

    engine = Engine(mtp_model, None, frozenset(), EngineConfig(speculative="mtp:2", max_num_batched_tokens=64))
    mlp = engine.speculator.module.block.mlp
    heard = []
    mlp.tap = lambda layer, ids: heard.append(int(ids.unique().numel()))
    reqs = mixed_requests(6, VOCAB, seed=4)
    run_arrivals(engine, reqs, [0] * 6)
    ex = engine.runner.experts
    assert ex.draft_layers == engine.speculator.forwards == len(heard) > 0 and ex.draft == sum(heard)
    per_expert = sum(t.nbytes for t in mlp.store.tensors()) // mtp_model.spec.moe.num_experts
    assert ex.draft_bytes == ex.draft * per_expert
    s = speculative_summary("mtp:2", speculative_counters(engine.stats, ex), 1000.0)
    target = s["experts_per_layer_verify"] * s["expert_layers"] / s["verify_steps"] * 1000.0
    assert s["expert_bytes_per_step_draft"] == ex.draft_bytes / s["verify_steps"] > 0
    assert s["expert_bytes_per_step_verify"] == pytest.approx(target + s["expert_bytes_per_step_draft"])
