"""Tiny random-init Hugging Face checkpoints (built with transformers) for parity tests."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 320

BASE = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)

CONFIGS: dict[str, dict] = {
    "mixtral": dict(BASE, intermediate_size=40, num_local_experts=5, num_experts_per_tok=2, sliding_window=8),
    "qwen2_moe": dict(BASE, num_hidden_layers=4, intermediate_size=56, moe_intermediate_size=24,
                      shared_expert_intermediate_size=36, num_experts=6, num_experts_per_tok=2,
                      decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False),
    "qwen3_moe": dict(BASE, head_dim=16, intermediate_size=56, moe_intermediate_size=24, num_experts=7,
                      num_experts_per_tok=3, norm_topk_prob=True),
    "olmoe": dict(BASE, intermediate_size=24, num_experts=6, num_experts_per_tok=2, clip_qkv=1.5),
    "deepseek_v3": dict(BASE, num_key_value_heads=4, intermediate_size=56, moe_intermediate_size=24,
                        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                        first_k_dense_replace=1, routed_scaling_factor=1.5, q_lora_rank=20, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12, rope_interleave=True,
                        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                             original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                                             mscale=1.0, mscale_all_dim=0.7)),
}


def build_tokenizer(out: Path) -> None:
    """A byte-level BPE trained on a few lines of code, saved so AutoTokenizer loads it offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int\n    y: int\n",
              "for i in range(10):\n    print(i)\n", "import os\nimport sys\n"] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(out))


def build_checkpoint(model_type: str, out: Path, shard: bool = True, seed: int = 0, **overrides) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    kwargs = dict(CONFIGS[model_type], **overrides)
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    if model_type == "deepseek_v3":  # a real selection bias: changes choices, never weights
        for layer in model.model.layers[config.first_k_dense_replace:]:
            layer.mlp.gate.e_score_correction_bias.uniform_(0.0, 0.3)
    model.save_pretrained(str(out), max_shard_size="60KB" if shard else "2GB")
    build_tokenizer(out)
    return out


def build_mtp_checkpoint(model_type: str, out: Path, seed: int = 0, own_head: bool = True, **overrides) -> Path:
    """A tiny checkpoint with one random MTP layer in the DeepSeek-V3 layout (model/mtp.py): built
    with one decoder layer more than it declares, whose block becomes layer L's MTP block, plus
    enorm, hnorm, eh_proj, shared_head.norm (and, with own_head, shared_head.head and
    embed_tokens) written beside it; config.json gains num_nextn_predict_layers: 1."""
    import json

    from safetensors.torch import load_file, save_file

    L = int(overrides.pop("num_hidden_layers", CONFIGS[model_type]["num_hidden_layers"]))
    build_checkpoint(model_type, out, shard=False, seed=seed, num_hidden_layers=L + 1, **overrides)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(num_hidden_layers=L, num_nextn_predict_layers=1)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = load_file(str(out / "model.safetensors"))
    gen, D, V = torch.Generator().manual_seed(seed + 100), cfg["hidden_size"], cfg["vocab_size"]
    p = f"model.layers.{L}."
    for name in ("enorm", "hnorm", "shared_head.norm"):
        tensors[p + name + ".weight"] = 1.0 + 0.2 * torch.rand(D, generator=gen)
    tensors[p + "eh_proj.weight"] = 0.2 * torch.randn(D, 2 * D, generator=gen)
    if own_head:
        tensors[p + "shared_head.head.weight"] = 0.2 * torch.randn(V, D, generator=gen)
        tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
