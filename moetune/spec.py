"""ModelSpec: the canonical, architecture-neutral description of an MoE checkpoint.

Adapters (`adapters.py`) translate each Hugging Face `config.json` into this; everything after
loading reads only this, never the raw HF keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding: plain, or YaRN-scaled (DeepSeek-V3)."""

    theta: float = 10000.0
    dim: int = 0  # rotary dims per head (the whole head for GQA, qk_rope_head_dim for MLA)
    kind: Literal["default", "yarn", "linear"] = "default"
    factor: float = 1.0
    original_max_position: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True
    interleave: bool = False  # DeepSeek lays rotary dims out as (x0, x1), (x2, x3), ...


@dataclass(frozen=True)
class GQASpec:
    """Grouped-query attention (Mixtral, Qwen-MoE, OLMoE)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    qk_norm: Literal["none", "per_head", "full"] = "none"  # qwen3_moe: per head; olmoe: whole proj
    clip_qkv: float | None = None
    sliding_window: int | None = None


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3). The KV cache holds the latent, not K/V."""

    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class RouterSpec:
    """How a token picks its K experts (docs/architecture.md §2, phase `router`)."""

    score: Literal["softmax", "sigmoid"] = "softmax"
    top_k: int = 2
    renormalize: bool = True
    n_group: int = 1
    topk_group: int = 1
    has_selection_bias: bool = False  # e_score_correction_bias: affects selection, not weights
    scaling_factor: float = 1.0


@dataclass(frozen=True)
class MoESpec:
    num_experts: int  # E
    intermediate_size: int  # I
    router: RouterSpec
    shared_intermediate_size: int = 0  # 0 = no shared expert
    shared_gate: bool = False  # qwen2_moe: shared output scaled by sigmoid(shared_expert_gate(x))


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: the MLP is either dense (`dense_intermediate`) or MoE."""

    index: int
    is_moe: bool
    dense_intermediate: int = 0


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int  # D
    num_layers: int  # L
    max_position: int
    rms_norm_eps: float
    attention: GQASpec | MLASpec
    rope: RopeSpec
    moe: MoESpec
    layers: tuple[LayerSpec, ...] = field(default_factory=tuple)
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def moe_layers(self) -> list[int]:
        return [layer.index for layer in self.layers if layer.is_moe]
