"""Tensor parallelism (real gloo process groups, one thread per rank) computes what one rank computes:
prompt logits within 1e-4 and the same greedy tokens (32 for the longest request), for every model
family, with attention and experts split (TP 2), experts alone split (expert-TP 2), attention alone
split, TP 2 × EP 2 on 4 ranks, and TP 4 (fewer KV heads than ranks: each rank holds a copy of one),
offloaded experts per rank, olmoe's q/k norm over the whole projection at TP 2 and 4;
int8 / int4 experts under expert-TP equal the same quantized model on one rank (within the bound of
the integer paths' rounding of x, below); sampling agrees across a TP group; each rank reads about
its share of the checkpoint.

Quantized experts: the CPU integer paths round each expert input per block of columns (int8: 64,
int4: the group), and a rank's slice of w2's input is whole blocks, so the mesh rounds x as one rank
does — but both round inputs that differ by fp32 reassociation, and an element on a rounding edge
may round the other way: one step, a relative input error of at most 2r per stage (r =
`linear.rounding_rel(block)`). Bound: 1e-4 + S·2r relative to max |logit|, S = 2 stages (w13, w2) per
MoE layer."""

import functools

import pytest
import torch

from moetune.config import parse_config
from moetune.engine.build import build_generator
from moetune.engine.distributed import run_ranks
from moetune.engine.sampling import SamplingParams
from moetune.kernels.cpu.linear import X_BLOCK, rounding_rel
from moetune.model.validate import read_spec
from moetune.quant.formats import parse_format
from tests.checkpoints import build_checkpoint
from tests.dist import jobs

MAX_TOKENS = [32, 8, 20]
MODELS = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {m: build_checkpoint(m, tmp_path_factory.mktemp(m), shard=False) for m in MODELS}
    # int4-g32 needs D and I / 2 to be multiples of 32
    out["mixtral_wide"] = build_checkpoint("mixtral", tmp_path_factory.mktemp("wide"), shard=False,
                                           hidden_size=64, intermediate_size=128)
    out["olmoe"] = build_checkpoint("olmoe", tmp_path_factory.mktemp("olmoe"), shard=False)
    return out


def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in (7, 4, 11)]


def config(path, parallel=None, quant=None, offload=None):
    data = {"model": {"path": str(path), "device": "cpu"}, "parallel": {**(parallel or {}), "timeout_s": 60}}
    extra = {k: v for k, v in (("quant", quant), ("offload", offload)) if v is not None}
    return parse_config({**data, **extra})


def reference(path, quant=None):
    """One rank: each prompt's logits alone, then the greedy completions batched."""
    gen = build_generator(config(path, quant=quant))
    logits = [gen.model.logits(gen.engine.runner.forward_prompts([p])) for p in prompts()]
    gen = build_generator(config(path, quant=quant))
    done = gen.generate(prompts(), [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS])
    return logits, [c.token_ids for c in done]


def rounding_bound(path, quant) -> float:
    """0, or S·2r of the module doc for quantized experts (relative to max |logit|)."""
    if not quant or "experts" not in quant:
        return 0.0
    block = parse_format(quant["experts"]).group or X_BLOCK
    return 2 * len(read_spec(path).moe_layers) * 2 * rounding_rel(block)


def assert_same_as_one_rank(path, parallel, quant=None, offload=None):
    ref_logits, ref_tokens = reference(path, quant)  # offloading: the resident model is the reference
    job = functools.partial(jobs.parity, prompts(), MAX_TOKENS)
    logits, tokens, _ = run_ranks(config(path, parallel, quant, offload), job)
    assert tokens == ref_tokens
    for got, want in zip(logits, ref_logits):
        atol = 1e-4 + rounding_bound(path, quant) * want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("model", MODELS)
def test_tp2_equals_one_rank(checkpoints, model):
    assert_same_as_one_rank(checkpoints[model], {"tp_size": 2})  # experts split too (expert_tp_size = tp_size)


@pytest.mark.parametrize("model", MODELS)
def test_expert_tp2_equals_one_rank(checkpoints, model):
    assert_same_as_one_rank(checkpoints[model], {"expert_tp_size": 2})  # attention whole on both ranks


def test_attention_tp_with_whole_experts(checkpoints):
    assert_same_as_one_rank(checkpoints["qwen2_moe"], {"tp_size": 2, "expert_tp_size": 1})


@pytest.mark.parametrize("model, parallel", [
    ("mixtral", {"tp_size": 2, "ep_size": 2, "redundant_experts": 1}),  # 5 experts + 1 replica over 2 EP ranks
    ("deepseek_v3", {"tp_size": 2, "ep_size": 2, "placement": "round_robin"}),
])
def test_tp2_by_ep2_on_four_ranks(checkpoints, model, parallel):
    assert_same_as_one_rank(checkpoints[model], parallel)


@pytest.mark.parametrize("tp", [2, 4])
def test_olmoe_full_qk_norm_split_over_the_group(checkpoints, tp):
    """olmoe's q/k RMSNorm over the whole projection (and its qkv clip): each rank's part normed by
    the group's summed squares; at TP 4 each of the 2 KV heads is held by 2 ranks and counted once."""
    assert_same_as_one_rank(checkpoints["olmoe"], {"tp_size": tp})


def test_tp4_with_fewer_kv_heads_than_ranks(checkpoints):
    assert_same_as_one_rank(checkpoints["mixtral"], {"tp_size": 4})  # 2 KV heads: each held by 2 ranks


@pytest.mark.parametrize("fmt", ["int8", "int4-g32"])
def test_quantized_experts_under_expert_tp_equal_the_quantized_model(checkpoints, fmt):
    """Packed whole, then sliced: each rank's rows and columns keep the one-rank model's bytes and
    scales (int4 cut at group boundaries: I / 2 = 64 columns = 2 groups of 32; int8: one x block of 64)."""
    assert_same_as_one_rank(checkpoints["mixtral_wide"], {"tp_size": 2}, {"experts": fmt})


def test_offloaded_experts_per_rank(checkpoints):
    """Each rank offloads its own expert slices (2 of 5 resident per layer, prefetch depth 1)."""
    assert_same_as_one_rank(checkpoints["mixtral"], {"tp_size": 2}, offload={"resident_experts": 2})


@pytest.mark.parametrize("seed, parallel", [
    (7, {"tp_size": 2}), (None, {"tp_size": 2}),
    (None, {"tp_size": 2, "ep_size": 2, "redundant_experts": 1}),  # the TP group is a subgroup of 4 ranks
])
def test_a_tp_group_samples_one_token(checkpoints, seed, parallel):
    """Every rank of a TP group holds the same gathered logits and keeps the group's rank 0's draw,
    even when each process's RNG differs (seed None); seeded requests draw what one rank draws."""
    path = checkpoints["qwen3_moe"]
    every = run_ranks(config(path, parallel), functools.partial(jobs.sampled_on_every_rank, prompts(), seed))
    for d in range(0, len(every), 2):  # ranks 2d and 2d + 1 are one TP group
        assert every[d] == every[d + 1] and every[d]
    served = {i: tokens for part in every for i, tokens in part.items()}
    assert sorted(served) == [0, 1, 2]
    if seed is not None:
        gen = build_generator(config(path))
        done = gen.generate(prompts(), SamplingParams(max_tokens=12, temperature=1.3, seed=seed, ignore_eos=True))
        assert [served[i] for i in range(3)] == [c.token_ids for c in done]


def test_each_rank_reads_and_holds_its_share(checkpoints):
    """TP 2 with experts split: everything but norms, routers and MLA's latent projection is halved,
    so each rank reads and holds a little over half of what one rank does."""
    path = checkpoints["deepseek_v3"]
    one = build_generator(config(path)).model
    whole_read, whole_held = one.bytes_read, sum(one.weight_bytes().values())
    for read, held in run_ranks(config(path, {"tp_size": 2}), jobs.loaded):
        assert 0.5 * whole_read < read < 0.65 * whole_read
        assert 0.5 * whole_held < held < 0.65 * whole_held
