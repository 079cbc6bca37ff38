"""Dense projections in int8 / int4 (model/dense_quant.py): a checkpoint written by `moetune quantize
--dense` loads to the same numbers as packing on load; the CPU kernels' model equals its dequantised
twin; every part is packed; refusals are one line.

Bound stated: with every weight packed (experts and dense projections), the logits of the model on
the CPU kernels and those of the same model with each packed weight replaced by its dequantised fp32
copy (computed by torch) differ by at most BOUND relative (norm of the difference over the norm), and
elementwise by BOUND · max |logit|, where BOUND = 1e-4 (the kernels reassociate fp32 sums) + S · r:
the integer paths (`runtime.Q8_ROWS`, `Q4_ROWS`) round each packed weight's input x per block, a
relative input error of at most r = √block / (2·levels) (`linear.rounding_rel`: 8.6e-5 for blocks of
32, 1.2e-4 for 64 with int16 x; int4 on the interleaved kernels rounds x to int8 parts, levels
127·254^(parts − 1): `linear.x_levels`, 2.2e-2 for groups of 32 with one part, 8.8e-5 with two), plus
the fp16 scales such a call may read (`linear.scale_rel`: 2⁻¹¹), and S counts the packed weights (each
input rounding once on the path, a stage passing a relative input error on with gain ≤ 1 — the
assumption of this bound).
"""

import pytest
import torch

pytest.importorskip("numba")

from moetune.errors import CheckpointError  # noqa: E402
from moetune.kernels.cpu.formats import dequantize  # noqa: E402
from moetune.kernels.cpu.linear import rounding_rel, scale_rel, x_block, x_levels  # noqa: E402
from moetune.kernels.quant_formats import PackedWeight, WeightFormat  # noqa: E402
from moetune.model.dense_quant import dense_precision, packed_weights, quantize_dense  # noqa: E402
from moetune.model.dense_quant import dense_slots  # noqa: E402
from moetune.model.loader import load_model  # noqa: E402
from moetune.moe.layer import MoELayer  # noqa: E402
from moetune.model.quant_checkpoint import read_block, read_quantization  # noqa: E402
from moetune.model.quantize import write_quantized  # noqa: E402
from moetune.model.validate import read_spec, validate_checkpoint  # noqa: E402
from moetune.quant.names import QuantError  # noqa: E402
from moetune.quant.table import uniform  # noqa: E402
from tests.checkpoints import build_checkpoint  # noqa: E402
from tests.forward import prompt_hidden  # noqa: E402

IDS = [[5, 17, 40, 99, 3, 250, 7, 8, 9], [11, 2, 64]]
FP32_BOUND = 1e-4  # reassociated fp32 sums


def _ck(tmp_path_factory, model_type: str, **sizes):
    return build_checkpoint(model_type, tmp_path_factory.mktemp(f"dq_{model_type}"), **sizes)


@pytest.fixture(scope="module")
def cks(tmp_path_factory):
    """Every in-feature a multiple of 32 (int4-g32 fits): GQA (qwen3_moe), MLA with a dense layer and
    shared experts (deepseek_v3), a gated shared expert and a dense layer (qwen2_moe), tied and
    untied LM heads."""
    return {
        "qwen3_moe": _ck(tmp_path_factory, "qwen3_moe", hidden_size=64, moe_intermediate_size=64,
                         intermediate_size=64, tie_word_embeddings=True),
        "deepseek_v3": _ck(tmp_path_factory, "deepseek_v3", hidden_size=64, moe_intermediate_size=32,
                           intermediate_size=64, q_lora_rank=32, kv_lora_rank=32, v_head_dim=16),
        "qwen2_moe": _ck(tmp_path_factory, "qwen2_moe", hidden_size=64, moe_intermediate_size=32,
                         intermediate_size=64, shared_expert_intermediate_size=32),
    }


def _twin(model):
    """The same model with every packed weight replaced by its dequantised fp32 copy."""
    for layer in model.layers:
        for _, owner, attr in dense_slots(layer):
            w = getattr(owner, attr)
            if isinstance(w, PackedWeight):
                setattr(owner, attr, dequantize(w))
    if isinstance(model.lm_head, PackedWeight):
        model.lm_head = dequantize(model.lm_head)
    return model


def _logits(model) -> torch.Tensor:
    return model.logits(prompt_hidden(model, IDS))  # [T, V]


def _bound(model) -> float:
    """FP32_BOUND + S·r over the model's packed weights (experts: w13 and w2 of each MoE layer)."""
    packed = packed_weights(model)
    moe = sum(1 for layer in model.layers if isinstance(layer.mlp, MoELayer))
    block = max(x_block(w) for w in packed)
    levels = min(x_levels(w) for w in packed)
    scales = max(scale_rel(w) for w in packed)  # fp16 where a call of ≤ 16 rows reads them (the worst case)
    return FP32_BOUND + (len(packed) + 2 * moe) * (rounding_rel(block, levels) + scales)


def _within_bound(got: torch.Tensor, want: torch.Tensor, bound: float) -> None:
    assert ((got - want).norm() / want.norm()).item() <= bound
    torch.testing.assert_close(got, want, rtol=0, atol=bound * want.abs().max().item())


@pytest.mark.parametrize("model_type", ["qwen3_moe", "deepseek_v3", "qwen2_moe"])
@pytest.mark.parametrize("fmt", ["int8", "int4-g32"])
def test_stored_equals_packed_on_load_and_the_kernels_equal_the_dequantised_twin(model_type, fmt, cks, tmp_path):
    ck = cks[model_type]
    spec = read_spec(ck)
    sizes = write_quantized(ck, spec, None, tmp_path / "q", fmt)
    assert 0 < sizes["dense_bytes_after"] < sizes["dense_bytes_before"] / 3
    assert read_block(tmp_path / "q")["dense"] == fmt and read_quantization(tmp_path / "q", spec) is None
    validate_checkpoint(tmp_path / "q", read_spec(tmp_path / "q"))
    stored, on_load, plain = load_model(tmp_path / "q"), load_model(ck, dense=fmt), load_model(ck)
    parts = {"qwen3_moe": {"attention", "lm_head"}, "deepseek_v3": {"attention", "dense_mlp", "shared_expert", "lm_head"},
             "qwen2_moe": {"attention", "dense_mlp", "shared_expert", "lm_head"}}[model_type]
    assert dense_precision(stored) == dict.fromkeys(parts, fmt) == dense_precision(on_load)
    assert dense_precision(plain) == dict.fromkeys(parts, "fp32")
    assert stored.embed.dtype == torch.float32  # gathered rows: the embedding stays float
    got = _logits(stored)
    torch.testing.assert_close(got, _logits(on_load), rtol=0, atol=0)  # the same bytes either way
    _within_bound(got, _logits(_twin(load_model(tmp_path / "q", kernel_backend="torch"))), _bound(stored))
    assert not torch.equal(got, _logits(plain))  # really quantized
    assert stored.weight_bytes()["dense"] < plain.weight_bytes()["dense"]


def test_a_fully_int8_model_equals_its_dequantised_twin_within_the_bound(cks):
    ck = cks["qwen2_moe"]
    spec = read_spec(ck)
    table = uniform("int8", list(spec.moe_layers), spec.moe.num_experts)
    kernels = load_model(ck, precision=table, dense="int8")
    twin = _twin(load_model(ck, precision=table, dense="int8", kernel_backend="torch"))
    assert {w.fmt for w in packed_weights(kernels)} == {WeightFormat.INT8}
    _within_bound(_logits(kernels), _logits(twin), _bound(kernels))
    plain = _logits(load_model(ck))  # and int8 everywhere stays near the float model
    assert ((_logits(kernels) - plain).norm() / plain.norm()).item() < 0.1


def test_a_tied_head_gets_its_own_packed_copy(cks, tmp_path):
    ck = cks["qwen3_moe"]
    write_quantized(ck, read_spec(ck), None, tmp_path / "q", "int8")
    model = load_model(tmp_path / "q")
    assert isinstance(model.lm_head, PackedWeight) and model.embed.dtype == torch.float32
    on_load = load_model(ck)
    quantize_dense(on_load, "int8")
    torch.testing.assert_close(dequantize(model.lm_head), dequantize(on_load.lm_head), rtol=0, atol=0)


def test_refusals_are_one_line(cks, tmp_path):
    ck = cks["qwen3_moe"]
    write_quantized(ck, read_spec(ck), None, tmp_path / "q", "int8")
    with pytest.raises(QuantError, match="already int8"):
        load_model(tmp_path / "q", dense="int8")
    with pytest.raises(QuantError, match="int8 or int4-g32"):
        load_model(ck, dense="fp8")
    odd = build_checkpoint("qwen3_moe", tmp_path / "odd")  # D = 48: a group of 32 does not divide it
    with pytest.raises(QuantError, match="group size 32 does not divide"):
        load_model(odd, dense="int4-g32")
    from safetensors.torch import load_file, save_file

    file = tmp_path / "q" / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["model.layers.0.self_attn.o_proj.scales"]
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError, match="lacks the scales 'model.layers.0.self_attn.o_proj.scales'"):
        validate_checkpoint(tmp_path / "q", read_spec(tmp_path / "q"))
