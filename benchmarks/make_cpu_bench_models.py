"""Random-init fp32 checkpoints of issue 13's CPU benchmark shapes (transformers save_pretrained).

  python benchmarks/make_cpu_bench_models.py mixtral OUT   # hidden 768, 8 layers, 8 experts top-2, I 2048
  python benchmarks/make_cpu_bench_models.py qwen3 OUT     # hidden 768, 8 layers, 64 experts top-8, I 256

Both: vocab 32000, 12 heads, 4 KV heads (head dim 64), fp32, seed 0, initializer_range 0.02; the
bundled model's tokenizer files are copied beside the weights so every command can load them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

SHAPES = {
    "mixtral": dict(intermediate_size=2048, num_local_experts=8, num_experts_per_tok=2),
    "qwen3_moe": dict(intermediate_size=2048, moe_intermediate_size=256, num_experts=64, num_experts_per_tok=8,
                      head_dim=64, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
}


def main() -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from moetune.model.registry import resolve_model

    kind, out = sys.argv[1], Path(sys.argv[2])
    model_type = {"mixtral": "mixtral", "qwen3": "qwen3_moe"}[kind]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, vocab_size=32000, hidden_size=768, num_hidden_layers=8,
                               num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096,
                               initializer_range=0.02, bos_token_id=1, eos_token_id=2, **SHAPES[model_type])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
    model.save_pretrained(str(out))
    for f in resolve_model(None).iterdir():
        if "token" in f.name:
            shutil.copy(f, out / f.name)


if __name__ == "__main__":
    main()
