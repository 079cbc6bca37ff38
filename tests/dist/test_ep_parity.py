"""R expert-parallel ranks (gloo, one thread each) compute what one rank computes: prompt logits and
greedy tokens, for every placement policy, with replicas, with idle ranks (fewer requests than ranks)
and ranks that finish early (requests of different lengths)."""

import functools

import numpy as np
import pytest
import torch

from moetune.config import parse_config
from moetune.engine.build import build_generator
from moetune.engine.distributed import run_ranks
from moetune.engine.sampling import SamplingParams
from moetune.model.loader import read_spec
from moetune.moe.placement import make_placement, write_placement
from tests.checkpoints import build_checkpoint
from tests.dist import jobs

MAX_TOKENS = [6, 2, 4]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {m: build_checkpoint(m, tmp_path_factory.mktemp(m), shard=False)
            for m in ("mixtral", "qwen2_moe", "deepseek_v3")}


def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in (7, 4, 11)]


def reference(path, parallel=None):
    cfg = parse_config({"model": {"path": str(path), "device": "cpu"}, "parallel": parallel or {}})
    gen = build_generator(cfg)
    logits = [gen.model.logits(gen.engine.runner.forward_prompts([p])) for p in prompts()]
    gen = build_generator(cfg)
    done = gen.generate(prompts(), [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS])
    return logits, [c.token_ids for c in done]


def eplb_file(path, tmp_path, ep_size, redundant, groups=1, nodes=1):
    spec = read_spec(path)
    loads = np.random.default_rng(0).integers(1, 100, (len(spec.moe_layers), spec.moe.num_experts))
    placed = make_placement("eplb", spec.moe.num_experts, ep_size, spec.moe_layers, redundant, loads.astype(float),
                            groups, nodes, spec.model_type)
    out = tmp_path / "placement.json"
    write_placement(placed, out, loads)
    return str(out)


CASES = [  # model, R, placement, redundant
    ("mixtral", 2, "contiguous", 1),
    ("mixtral", 4, "round_robin", 3),
    ("qwen2_moe", 2, "round_robin", 0),
    ("qwen2_moe", 4, "eplb", 2),
    ("deepseek_v3", 2, "eplb", 2),
    ("deepseek_v3", 4, "contiguous", 0),
]


@pytest.mark.parametrize("model, R, policy, redundant", CASES)
def test_ranks_equal_one_rank(checkpoints, tmp_path, model, R, policy, redundant):
    path = checkpoints[model]
    ref_logits, ref_tokens = reference(path)
    if policy == "eplb":  # deepseek_v3 has 4 expert groups: the hierarchical policy over 2 nodes
        groups, nodes = (4, 2) if model == "deepseek_v3" else (1, 1)
        parallel = {"ep_size": R, "placement": eplb_file(path, tmp_path, R, redundant, groups, nodes)}
    else:
        parallel = {"ep_size": R, "placement": policy, "redundant_experts": redundant}
    cfg = parse_config({"model": {"path": str(path), "device": "cpu"}, "parallel": {**parallel, "timeout_s": 60}})
    logits, tokens, _ = run_ranks(cfg, functools.partial(jobs.parity, prompts(), MAX_TOKENS))
    assert tokens == ref_tokens
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", ["contiguous", "round_robin"])
def test_replicas_on_one_rank_change_nothing(checkpoints, policy):
    path = checkpoints["qwen2_moe"]
    ref_logits, ref_tokens = reference(path)
    logits, tokens = reference(path, {"placement": policy, "redundant_experts": 5})
    assert tokens == ref_tokens
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_bf16_wire_stays_close_and_sends_half_the_bytes(checkpoints):
    """parallel.dispatch_dtype bf16: rows are cast for the all-to-alls only, so logits move by about
    bf16's rounding of the expert inputs and outputs; every row costs 2 bytes per value, not 4."""
    path = checkpoints["mixtral"]
    ref_logits, _ = reference(path)
    wire = {}
    for dtype in ("auto", "bf16"):
        cfg = parse_config({"model": {"path": str(path), "device": "cpu"},
                            "parallel": {"ep_size": 2, "redundant_experts": 1, "dispatch_dtype": dtype, "timeout_s": 60}})
        wire[dtype] = run_ranks(cfg, functools.partial(jobs.logits_and_bytes, prompts()))
    for got, want in zip(wire["bf16"][0], ref_logits):
        err = (got - want).abs().max().item()
        assert 0 < err < 0.02 * want.abs().max().item()
    assert 2 * wire["bf16"][1] == wire["auto"][1] > 0


QUANT_CASES = [  # model, R, placement, redundant, formats per logical expert, backend, stored by moetune quantize
    ("mixtral", 2, "round_robin", 1, ["int8", "fp32", "int8", "fp32", "int8"], "auto", False),
    ("deepseek_v3", 2, "contiguous", 2, ["bf16", "int8", "fp32", "int8", "bf16", "fp32", "int8", "int8"], "torch", False),
    ("qwen2_moe", 2, "eplb", 2, None, "auto", True),
]


@pytest.mark.parametrize("model, R, policy, redundant, formats, backend, stored", QUANT_CASES)
def test_per_expert_quantization_on_ranks_with_replicas_equals_the_same_mix_on_one_rank(
        checkpoints, tmp_path, model, R, policy, redundant, formats, backend, stored):
    """A rank's slots are sorted by format (`Placement.by_format`) so that each format is one group:
    the tokens and prompt logits equal the one-rank model holding the same mix."""
    import json

    path = checkpoints[model]
    spec = read_spec(path)
    E = spec.moe.num_experts
    formats = formats or [("int8", "fp32")[e % 3 == 0] for e in range(E)]
    table_file = tmp_path / "table.json"
    table_file.write_text(json.dumps({"default": formats}))
    quant = {"table": str(table_file)}
    if stored:  # the mix written by `moetune quantize`, loaded as stored
        from moetune.model.quantize import write_quantized
        from moetune.quant.table import read_table

        write_quantized(path, spec, read_table(table_file, list(spec.moe_layers), E), tmp_path / "q")
        path, quant = tmp_path / "q", None
    model_cfg = {"path": str(path), "device": "cpu", "kernel_backend": backend}
    one = build_generator(parse_config({"model": model_cfg, "quant": quant}))
    ref_logits = [one.model.logits(one.engine.runner.forward_prompts([p])) for p in prompts()]
    done = one.generate(prompts(), [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS])
    parallel = {"ep_size": R, "placement": policy, "redundant_experts": redundant, "timeout_s": 60}
    if policy == "eplb":
        parallel.update(placement=eplb_file(path, tmp_path, R, redundant), redundant_experts=0)
    cfg = parse_config({"model": model_cfg, "quant": quant, "parallel": parallel})
    logits, tokens, _ = run_ranks(cfg, functools.partial(jobs.parity, prompts(), MAX_TOKENS))
    assert tokens == [c.token_ids for c in done]
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_sorting_a_placement_by_format_keeps_ranks_and_replica_order():
    placed = make_placement("round_robin", 5, 2, [0], 1)
    formats = {0: ("int8", "fp32", "int8", "fp32", "int8")}
    by = placed.by_format(formats)
    n = placed.slots_per_rank
    for r in range(2):  # the same experts on each rank, one contiguous run per format
        mine = by.rank_experts(0, r)
        assert sorted(mine) == sorted(placed.rank_experts(0, r))
        names = [formats[0][e] for e in mine]
        assert names == sorted(names, key=["int8", "fp32"].index)
    for e in range(5):  # replicas keep their rank order, so token t's copy reaches the same rank
        assert [s // n for s in by.replicas(0)[e]] == [s // n for s in placed.replicas(0)[e]]


def test_buffer_capacity_on_ranks_equals_one_rank_without_limit(checkpoints):
    """`buffer` on 2 ranks (each rank's copies beyond its capacity in a second pass; an empty second
    pass still takes part in the all-to-alls) computes what one rank without a limit computes."""
    path = checkpoints["mixtral"]
    ref_logits, ref_tokens = reference(path)
    cfg = parse_config({"model": {"path": str(path), "device": "cpu"},
                        "parallel": {"ep_size": 2, "redundant_experts": 1, "capacity_factor": 1.0,
                                     "capacity_policy": "buffer", "timeout_s": 60}})
    logits, tokens, counts = run_ranks(cfg, functools.partial(jobs.parity_with_capacity, prompts(), MAX_TOKENS))
    assert counts["buffered"] > 0 and counts["dropped"] == 0  # rank 0 had copies over its capacity
    assert tokens == ref_tokens
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
