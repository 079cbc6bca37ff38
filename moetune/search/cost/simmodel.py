"""The model as the simulator sees it: sizes that set FLOPs and bytes, read from a ModelSpec.

Attention per token per layer: GQA projections D·(2·H·Dh + 2·Hkv·Dh) weights, K/V cache 2·Hkv·Dh
elements per token, scores + values 4·H·Dh FLOPs per (query, key) pair. MLA (absorbed form): the
projections of DeepSeek-V3 (q through q_lora_rank, kv_a, kv_b, o), a latent cache of
kv_lora_rank + rope dims per token, 4·H·kv_lora_rank + 2·H·rope FLOPs per pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.spec import GQASpec, ModelSpec


@dataclass(frozen=True)
class SimModel:
    name: str
    D: int
    E: int
    K: int
    I: int
    I_shared: int
    L: int  # decoder layers
    moe_layers: tuple[int, ...]
    dense_I: tuple[int, ...]  # intermediate size of each dense (non-MoE) layer
    V: int
    attn_weights: int  # per layer
    kv_elems: int  # cached elements per token per layer
    pair_flops: int  # per (query, key) pair per layer
    tied: bool
    kv_heads: int = 0  # GQA's KV heads (split by tensor parallelism); 0: MLA's latent, whole on every rank
    model_type: str = ""  # config.json's model_type (what the serving engines' support depends on)
    expert_groups: int = 1  # the router's expert groups (DeepSeek-V3's n_group)
    whole_qk_norm: bool = False  # olmoe: q/k norm over the whole projection (under TP one [T, 2] all-reduce a layer)
    heads: int = 0  # attention (query) heads, split by tensor parallelism; 0: not known (a hand-made model)
    weight_format: str = "none"  # the checkpoint's own weights: none (the model dtype) | fp8 (config.json's
    # quantization_config quant_method fp8, DeepSeek-V3 style: dense projections and every routed expert)
    mla: tuple[int, ...] = ()  # MLA's (q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head) (op_tables.py); () GQA

    @property
    def Lm(self) -> int:
        return len(self.moe_layers)

    @property
    def expert_weights(self) -> int:  # one routed expert: w1, w3, w2
        return 3 * self.D * self.I

    def dense_weights(self) -> int:
        """Every weight outside the routed experts (replicated on each rank)."""
        embed = self.V * self.D * (1 if self.tied else 2)
        per_moe = 3 * self.D * self.I_shared + self.D * self.E
        return embed + self.L * self.attn_weights + sum(3 * self.D * i for i in self.dense_I) + self.Lm * per_moe

    def dense_projections(self) -> int:
        """The dense weights a dense-precision knob stores (attention, dense-layer and shared-expert
        MLPs); the rest of `dense_weights` (embedding, LM head, routers) keeps the model dtype."""
        return self.L * self.attn_weights + sum(3 * self.D * i for i in self.dense_I) + self.Lm * 3 * self.D * self.I_shared

    def total_weights(self) -> int:
        return self.dense_weights() + self.Lm * self.E * self.expert_weights


def sim_model(spec: ModelSpec, name: str = "") -> SimModel:
    att = spec.attention
    D = spec.hidden_size
    if isinstance(att, GQASpec):
        H, Hkv, Dh = att.num_heads, att.num_kv_heads, att.head_dim
        weights, kv, pair = D * (2 * H * Dh + 2 * Hkv * Dh), 2 * Hkv * Dh, 4 * H * Dh
    else:
        H, qk, rope, lora = att.num_heads, att.qk_head_dim, att.qk_rope_head_dim, att.kv_lora_rank
        q = D * att.q_lora_rank + att.q_lora_rank * H * qk if att.q_lora_rank else D * H * qk
        weights = q + D * (lora + rope) + lora * H * (att.qk_nope_head_dim + att.v_head_dim) + H * att.v_head_dim * D
        kv, pair = lora + rope, 4 * H * lora + 2 * H * rope
    dense = tuple(l.dense_intermediate for l in spec.layers if not l.is_moe)
    return SimModel(name or spec.model_type, D, spec.moe.num_experts, spec.moe.router.top_k, spec.moe.intermediate_size,
                    spec.moe.shared_intermediate_size, spec.num_layers, tuple(spec.moe_layers), dense,
                    spec.vocab_size, weights, kv, pair, spec.tie_word_embeddings,
                    att.num_kv_heads if isinstance(att, GQASpec) else 0, spec.model_type, spec.moe.router.n_group,
                    isinstance(att, GQASpec) and att.qk_norm == "full", heads=att.num_heads,
                    mla=() if isinstance(att, GQASpec) else (att.q_lora_rank or 0, att.kv_lora_rank,
                                                             att.qk_nope_head_dim, att.qk_rope_head_dim, att.v_head_dim))
