"""`moetune quantize`'s checkpoint: written, validated from headers, loaded back to the same numbers
as packing on load, and refused one line at a time when damaged."""

import json

import pytest
import torch

from moetune.errors import CheckpointError
from moetune.experts.store import ExpertWeights
from moetune.model.loader import load_model
from moetune.model.quant_checkpoint import read_quantization
from moetune.model.quantize import write_quantized
from moetune.model.validate import read_spec, validate_checkpoint
from moetune.quant.formats import format_of
from moetune.quant.table import PrecisionTable
from moetune.quant.names import QuantError
from tests.checkpoints import build_checkpoint
from tests.forward import prompt_hidden

MIX = ["fp32", "int4-g32", "int8", "fp8", "int4-g64", "bf16", "int8"]  # 7 experts


@pytest.fixture(scope="module")
def ck64(tmp_path_factory):
    """qwen3_moe with D = 64, I = 32 (int4 groups 32 and 64 divide them); per-expert tensors."""
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("ck64"), shard=True, hidden_size=64,
                            moe_intermediate_size=64)


def _table(spec, names=MIX):
    return PrecisionTable({i: tuple(names[(i + e) % len(names)] for e in range(spec.moe.num_experts))
                           for i in spec.moe_layers})


def test_mixed_checkpoint_round_trips_to_the_numbers_of_packing_on_load(ck64, tmp_path):
    spec = read_spec(ck64)
    table = _table(spec)
    sizes = write_quantized(ck64, spec, table, tmp_path / "q")
    assert sizes["expert_bytes_after"] < sizes["expert_bytes_before"]
    assert read_quantization(tmp_path / "q", spec) == table
    validate_checkpoint(tmp_path / "q", read_spec(tmp_path / "q"))
    stored = load_model(tmp_path / "q", kernel_backend="torch")
    packed_on_load = load_model(ck64, kernel_backend="torch", precision=table)
    plain = load_model(ck64, kernel_backend="torch")
    for i in spec.moe_layers:
        w: ExpertWeights = stored.experts.weights(i)
        by_slot = [format_of(g.w13) for g in w.groups for _ in range(g.size)]
        logical_slot = w.slots.physical(torch.arange(spec.moe.num_experts)[:, None]).flatten().tolist()
        assert [by_slot[s] for s in logical_slot] == list(table.layer(i))
    ids = [[5, 17, 40, 99, 3, 250, 7, 8, 9]]
    a, b, c = prompt_hidden(stored, ids), prompt_hidden(packed_on_load, ids), prompt_hidden(plain, ids)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.equal(a, c)  # really quantized
    int8 = prompt_hidden(load_model(ck64, kernel_backend="torch", precision=_table(spec, ["int8"])), ids)
    assert ((int8 - c).norm() / c.norm()).item() < 0.05  # int8 experts: close to the plain model
    assert stored.experts.nbytes() < plain.experts.nbytes()


def test_missing_scales_and_wrong_packed_dtype_are_one_line(ck64, tmp_path):
    from safetensors.torch import load_file, save_file

    spec = read_spec(ck64)
    write_quantized(ck64, spec, _table(spec), tmp_path / "q")
    file = tmp_path / "q" / "model.safetensors"
    tensors = load_file(str(file))
    name = next(n for n in tensors if n.endswith("w2.scales"))
    del tensors[name]
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError, match=f"lacks the scales '{name}'"):
        validate_checkpoint(tmp_path / "q", spec)
    write_quantized(ck64, spec, _table(spec), tmp_path / "r")
    file = tmp_path / "r" / "model.safetensors"
    tensors = load_file(str(file))
    name = next(n for n in tensors if n.endswith("w13.qweight") and tensors[n].dtype == torch.int8)
    tensors[name] = tensors[name].float()
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError, match=f"'{name}'.*F32.*packed format.*I8"):
        validate_checkpoint(tmp_path / "r", spec)


def test_bad_quantization_blocks_and_combinations(ck64, tmp_path, checkpoint):
    spec = read_spec(ck64)
    write_quantized(ck64, spec, _table(spec), tmp_path / "q")
    with pytest.raises(QuantError, match="already quantized"):
        load_model(tmp_path / "q", kernel_backend="torch", precision=_table(spec))
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    cfg["quantization"]["formats"]["0"][0] = "int5"
    (tmp_path / "q" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown expert format 'int5'"):
        validate_checkpoint(tmp_path / "q", spec)
    tiny = checkpoint("qwen3_moe", shard=False)  # D = 48, I = 24: no int4 group divides them
    tspec = read_spec(tiny)
    with pytest.raises(QuantError, match="group size 32 does not divide"):
        load_model(tiny, kernel_backend="torch", precision=_table(tspec, ["int4-g32"]))
