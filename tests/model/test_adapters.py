
import pytest

from moetune.errors import CheckpointError
from moetune.model.adapters import spec_from_config
from moetune.model.loader import read_spec
from moetune.spec import GQASpec, MLASpec


def test_qwen2_moe_sparse_step_and_mlp_only_layers(checkpoint):
    spec = read_spec(checkpoint("qwen2_moe"))
    assert spec.moe_layers == [1]  # step 2 → layers 1, 3; layer 3 is listed in mlp_only_layers
    assert spec.moe.shared_intermediate_size == 36 and spec.moe.shared_gate
    assert spec.layers[0].dense_intermediate == 56


def test_deepseek_v3_keys(checkpoint):
    spec = read_spec(checkpoint("deepseek_v3"))
    r = spec.moe.router
    assert isinstance(spec.attention, MLASpec) and spec.attention.kv_lora_rank == 16
    assert (r.score, r.n_group, r.topk_group, r.scaling_factor) == ("sigmoid", 4, 2, 1.5)
    assert r.has_selection_bias and spec.moe_layers == [1, 2]
    assert spec.moe.shared_intermediate_size == 24
    assert spec.rope.kind == "yarn" and spec.rope.interleave and spec.rope.dim == 8


def test_olmoe_and_qwen3_qk_norm_kinds(checkpoint):
    olmoe, qwen3 = read_spec(checkpoint("olmoe")), read_spec(checkpoint("qwen3_moe"))
    assert isinstance(olmoe.attention, GQASpec) and olmoe.attention.qk_norm == "full"
    assert olmoe.attention.clip_qkv == 1.5 and not olmoe.moe.router.renormalize
    assert qwen3.attention.qk_norm == "per_head" and qwen3.moe.router.renormalize


def test_legacy_rope_scaling_keys_are_read():
    cfg = {"model_type": "deepseek_v3", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
           "num_attention_heads": 2, "kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
           "v_head_dim": 2, "moe_intermediate_size": 4, "intermediate_size": 8, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "rope_theta": 5000.0,
           "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                            "mscale": 1.0, "mscale_all_dim": 1.0}}
    spec = spec_from_config(cfg)
    assert spec.rope.kind == "yarn" and spec.rope.factor == 40 and spec.rope.theta == 5000.0


def test_unsupported_model_type_lists_supported():
    with pytest.raises(CheckpointError, match="supported: deepseek_v3, mixtral, olmoe, qwen2_moe, qwen3_moe"):
        spec_from_config({"model_type": "gpt2"})


def test_groups_must_divide_experts():
    base = {"model_type": "deepseek_v3", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
            "v_head_dim": 2, "moe_intermediate_size": 4, "intermediate_size": 8, "n_routed_experts": 6,
            "num_experts_per_tok": 2, "n_group": 4, "topk_group": 1, "first_k_dense_replace": 0}
    with pytest.raises(CheckpointError, match="n_group=4"):
        spec_from_config(base)
