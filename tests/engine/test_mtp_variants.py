"""MTP speculation on the bundled model (its trained head, so drafts are accepted) where the target
runs otherwise: a checkpoint written by `moetune quantize --policy int8 --dense int8` (the MTP
layer loads in the formats the checkpoint stores: its projections packed int8 like the target's,
its experts plain, since the expert policy covers the target's MoE layers only: model/loader.py
load_mtp), and offloaded experts (offload.resident_fraction 0.5: the MTP block keeps its own
resident experts). Greedy tokens equal the same target decoding without speculation."""

import json

import pytest

from moetune.config import parse_config
from moetune.engine.build import build_generator
from moetune.engine.sampling import SamplingParams
from moetune.kernels.quant_formats import PackedWeight
from moetune.model.registry import bundled_asset
from tests.cli_run import moetune


def prompts(n: int) -> list[str]:
    lines = bundled_asset("prompts/stdlib-heldout.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"][:200] for line in lines[:n]]


def generate(path, **sections):
    gen = build_generator(parse_config({"model": {"path": str(path), "device": "cpu"}, **sections}))
    done = gen.generate(prompts(4), SamplingParams(max_tokens=20, ignore_eos=True))
    return [c.token_ids for c in done], gen


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "stdlib-int8"
    r = moetune("quantize", "--policy", "int8", "--dense", "int8", "-o", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_mtp_on_a_quantized_checkpoint_equals_plain_decoding(quantized):
    plain, _ = generate(quantized)
    spec, gen = generate(quantized, engine={"speculative": "mtp:2"})
    assert spec == plain and gen.engine.stats.accepted_tokens > 0
    module, L = gen.engine.speculator.module, gen.model.spec.num_layers
    assert isinstance(module.eh_proj.weight, PackedWeight) and isinstance(module.block.attention.qkv.weight, PackedWeight)
    mtp_experts = module.block.mlp.store.acquire(L, None)
    assert mtp_experts.groups[0].w13.data.is_floating_point()  # plain precision
    target = gen.model.experts.acquire(gen.model.spec.moe_layers[0], None)
    assert not target.groups[0].w13.data.is_floating_point()  # int8


def test_mtp_with_offloaded_experts_equals_plain_decoding():
    plain, _ = generate("stdlib-moe")
    spec, gen = generate("stdlib-moe", engine={"speculative": "mtp:1"}, offload={"resident_fraction": 0.5})
    assert spec == plain and gen.engine.stats.accepted_tokens > 0
    assert not gen.model.experts.resident and gen.engine.speculator.module.block.mlp.store.resident
