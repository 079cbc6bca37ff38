"""The slices a tensor-parallel rank reads (ShardedSource) and holds (quantized experts sliced after
packing), checked against the whole tensors: the ranks' row / column parts put back together are the
whole, every KV head a rank holds is the one its query heads read, and a sliced packed expert
dequantises to the slice of the whole one (scales and int4 groups intact)."""

import pytest
import torch

from moetune.experts.store import ExpertWeights
from moetune.kernels.quant_formats import WeightFormat
from moetune.model.naming import TensorNames
from moetune.model.tp import TPPlan, local_spec
from moetune.model.tp_experts import shard_experts
from moetune.model.tp_shards import ShardedSource
from moetune.model.validate import read_spec
from moetune.model.weights import WeightSource
from moetune.quant.formats import pack, parse_format, unpack
from tests.checkpoints import build_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {m: build_checkpoint(m, tmp_path_factory.mktemp(m), shard=True) for m in ("mixtral", "deepseek_v3", "qwen2_moe")}


def sources(path, G):
    spec = read_spec(path)
    whole = WeightSource(path, "cpu", torch.float32)
    return spec, whole, [ShardedSource(WeightSource(path, "cpu", torch.float32), spec, TPPlan(G, t, True, True))
                         for t in range(G)]


@pytest.mark.parametrize("model, G", [("mixtral", 2), ("mixtral", 4), ("deepseek_v3", 2), ("qwen2_moe", 2)])
def test_the_ranks_parts_make_the_whole(checkpoints, model, G):
    spec, whole, ranks = sources(checkpoints[model], G)
    for name in whole.names():
        full = whole.get(name)
        index = ranks[0].index(name)
        parts = [r.get(name) for r in ranks]
        if index is None:
            assert all(torch.equal(p, full) for p in parts), name
        elif isinstance(index, list):  # fused gate_up [E, 2I, D]: each rank's gate rows, then its up rows
            I = full.shape[1] // 2
            gate = torch.cat([p[:, : I // G] for p in parts], 1)
            up = torch.cat([p[:, I // G :] for p in parts], 1)
            assert torch.equal(torch.cat([gate, up], 1), full), name
        elif ".k_proj." in name or ".v_proj." in name:
            continue  # below
        else:
            dim = len(index) - 1  # rows (dim 0) or columns (the last slice given)
            assert torch.equal(torch.cat(parts, dim), full), name
            assert all(p.shape[dim] == full.shape[dim] // G for p in parts), name


def test_each_rank_holds_the_kv_head_its_query_heads_read(checkpoints):
    """mixtral: 4 query heads, 2 KV heads; at G = 4 rank t has query head t, which reads KV head t // 2."""
    spec, whole, ranks = sources(checkpoints["mixtral"], 4)
    Dh = spec.attention.head_dim
    name = "model.layers.0.self_attn.k_proj.weight"
    full = whole.get(name)  # [Hkv·Dh, D]
    for t, r in enumerate(ranks):
        assert torch.equal(r.get(name), full[(t // 2) * Dh : (t // 2 + 1) * Dh])
        local = local_spec(spec, r.plan).attention
        assert (local.num_heads, local.num_kv_heads) == (1, 1)


def test_a_row_parallel_bias_is_added_once(checkpoints):
    """o_proj.bias (none of these models has one; a custom exporter may): rank 0 whole, the others zeros."""
    spec, _, ranks = sources(checkpoints["mixtral"], 2)
    assert ranks[0].index("model.layers.0.self_attn.o_proj.bias") is None
    assert ranks[1].index("model.layers.0.self_attn.o_proj.bias") == "zero"


def test_each_rank_reads_only_its_slices(checkpoints):
    spec, whole, ranks = sources(checkpoints["qwen2_moe"], 2)
    names = TensorNames(spec.model_type)
    layer = spec.moe_layers[0]
    fused = names.fused_experts(layer)[1]  # [E, D, I] (transformers 5), else one expert's [D, I]
    name = fused if whole.has(fused) else names.expert(layer, 1, "down")
    for r in ranks:
        r.get(name)
        assert r.inner.bytes_read == whole.get(name).numel() * 4 // 2


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp8", "int8", "int4-g32"])
@pytest.mark.parametrize("G", [2, 4])
def test_a_sliced_packed_expert_is_the_slice_of_the_whole(fmt, G):
    E, I, D = 3, 128, 64  # int4-g32 at G = 4: 32 columns per rank, one group
    g = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(E, 2 * I, D, generator=g), torch.randn(E, D, I, generator=g)
    f = parse_format(fmt)
    layer = ExpertWeights(pack(w13, f), pack(w2, f), ExpertWeights.dense(w13, w2).slots)
    full13, full2 = unpack(layer.w13), unpack(layer.w2)
    for t in range(G):
        part = shard_experts(layer, TPPlan(G, t, False, True))
        a, b = t * I // G, (t + 1) * I // G
        assert torch.equal(unpack(part.w13), torch.cat([full13[:, a:b], full13[:, I + a : I + b]], 1))
        assert torch.equal(unpack(part.w2), full2[:, :, a:b])
        assert part.w2.fmt == layer.w2.fmt and (part.w2.fmt != WeightFormat.INT4 or part.w2.group_size == 32)
