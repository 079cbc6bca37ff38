"""Checkpoint validation from safetensors headers: every supported layout passes, mistakes are named."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from moetune.errors import CheckpointError
from moetune.model.loader import load_model, read_spec
from moetune.model.naming import TensorNames
from moetune.model.registry import resolve_model
from moetune.model.validate import expected_tensors, validate_checkpoint
from tests.conftest import MODEL_TYPES


@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_tiny_checkpoint_validates_and_every_expected_tensor_exists(checkpoint, model_type, shard):
    path = checkpoint(model_type, shard=shard)
    spec = read_spec(path)
    found = validate_checkpoint(path, spec)
    required = {n for n, (_, req) in expected_tensors(spec, set(found)).items() if req}
    assert required <= set(found)
    assert len(required) > 10


def test_the_bundled_model_validates():
    path = resolve_model(None)
    assert validate_checkpoint(path, read_spec(path))


def _fuse(src, dst):
    """The transformers-5 fused expert layout: experts.gate_up_proj [E, 2I, D], experts.down_proj [E, D, I]."""
    shutil.copytree(src, dst)
    spec, names = read_spec(dst), None
    names = TensorNames(spec.model_type)
    tensors = load_file(str(dst / "model.safetensors"))
    for i in spec.moe_layers:
        E = spec.moe.num_experts
        gate = [tensors.pop(names.expert(i, e, "gate")) for e in range(E)]
        up = [tensors.pop(names.expert(i, e, "up")) for e in range(E)]
        down = [tensors.pop(names.expert(i, e, "down")) for e in range(E)]
        w13, w2 = names.fused_experts(i)
        tensors[w13] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
        tensors[w2] = torch.stack(down)
    save_file(tensors, str(dst / "model.safetensors"))
    return spec, tensors


def test_the_fused_expert_layout_validates_and_a_wrong_fused_shape_is_named(checkpoint, tmp_path):
    spec, tensors = _fuse(checkpoint("qwen3_moe", shard=False), tmp_path / "fused")
    validate_checkpoint(tmp_path / "fused", spec)
    load_model(tmp_path / "fused")  # the loader reads the same layout
    w13, _ = TensorNames(spec.model_type).fused_experts(spec.moe_layers[0])
    tensors[w13] = tensors[w13][:, :-2].contiguous()
    save_file(tensors, str(tmp_path / "fused" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=w13.replace(".", r"\.")):
        validate_checkpoint(tmp_path / "fused", spec)


def test_a_tied_lm_head_may_be_absent_but_an_untied_one_may_not(checkpoint, tmp_path):
    dst = tmp_path / "tied"
    shutil.copytree(checkpoint("mixtral", shard=False), dst)
    tensors = load_file(str(dst / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        validate_checkpoint(dst, read_spec(dst))
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    validate_checkpoint(dst, read_spec(dst))


def test_an_optional_bias_is_checked_when_present(checkpoint, tmp_path):
    dst = tmp_path / "bias"
    shutil.copytree(checkpoint("qwen2_moe", shard=False), dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["model.layers.0.self_attn.k_proj.bias"] = torch.zeros(5)
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"k_proj\.bias.*\[5\].*\[24\]"):
        validate_checkpoint(dst, read_spec(dst))
