"""HF `config.json` → ModelSpec, one small adapter per `model_type` (docs/architecture.md §5)."""

from __future__ import annotations

from typing import Any, Callable

from moetune.errors import CheckpointError
from moetune.spec import GQASpec, LayerSpec, MLASpec, MoESpec, ModelSpec, RopeSpec, RouterSpec

Cfg = dict[str, Any]


def _require(cfg: Cfg, key: str) -> Any:
    if cfg.get(key) is None:
        raise CheckpointError(f"config.json of model_type '{cfg.get('model_type')}' lacks '{key}'")
    return cfg[key]


def _num_experts(cfg: Cfg) -> int:
    """`num_experts` in released checkpoints; transformers 5 writes `num_local_experts` for some."""
    value = cfg.get("num_experts", cfg.get("num_local_experts"))
    if value is None:
        raise CheckpointError(f"config.json of model_type '{cfg.get('model_type')}' lacks 'num_experts'")
    return int(value)


def _eos_ids(cfg: Cfg) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def rope_from_config(cfg: Cfg, dim: int, interleave: bool = False) -> RopeSpec:
    """Reads both the transformers-5 `rope_parameters` and the older `rope_theta`/`rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ("default", "yarn", "linear"):
        raise CheckpointError(f"rope type '{kind}' is not supported (supported: default, yarn, linear)")
    return RopeSpec(
        theta=theta,
        dim=dim,
        kind=kind,
        factor=float(params.get("factor") or 1.0),
        original_max_position=int(
            params.get("original_max_position_embeddings") or cfg.get("max_position_embeddings", 0)
        ),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=float(params.get("mscale") or 0.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
        interleave=interleave,
    )


def _softmax_router(cfg: Cfg, renormalize: bool) -> RouterSpec:
    return RouterSpec(score="softmax", top_k=int(_require(cfg, "num_experts_per_tok")), renormalize=renormalize)


def _gqa(cfg: Cfg, qk_norm: str = "none") -> tuple[GQASpec, RopeSpec]:
    heads = int(_require(cfg, "num_attention_heads"))
    head_dim = cfg.get("head_dim") or int(_require(cfg, "hidden_size")) // heads
    gqa = GQASpec(
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        qk_norm=qk_norm,  # type: ignore[arg-type]
        clip_qkv=cfg.get("clip_qkv"),
        sliding_window=cfg.get("sliding_window"),
    )
    return gqa, rope_from_config(cfg, int(head_dim))


def _base(cfg: Cfg, attention, rope, moe: MoESpec, layers: list[LayerSpec]) -> ModelSpec:
    return ModelSpec(
        model_type=cfg["model_type"],
        vocab_size=int(_require(cfg, "vocab_size")),
        hidden_size=int(_require(cfg, "hidden_size")),
        num_layers=len(layers),
        max_position=int(cfg.get("max_position_embeddings") or 4096),
        rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-6),
        attention=attention,
        rope=rope,
        moe=moe,
        layers=tuple(layers),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        hidden_act=cfg.get("hidden_act", "silu"),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg),
    )


def _all_moe(cfg: Cfg) -> list[LayerSpec]:
    return [LayerSpec(i, True) for i in range(int(_require(cfg, "num_hidden_layers")))]


def mixtral(cfg: Cfg) -> ModelSpec:
    attention, rope = _gqa(cfg)
    moe = MoESpec(
        num_experts=int(_require(cfg, "num_local_experts")),
        intermediate_size=int(_require(cfg, "intermediate_size")),
        router=_softmax_router(cfg, renormalize=True),
    )
    return _base(cfg, attention, rope, moe, _all_moe(cfg))


def olmoe(cfg: Cfg) -> ModelSpec:
    attention, rope = _gqa(cfg, qk_norm="full")
    moe = MoESpec(
        num_experts=_num_experts(cfg),
        intermediate_size=int(_require(cfg, "intermediate_size")),
        router=_softmax_router(cfg, renormalize=bool(cfg.get("norm_topk_prob", False))),
    )
    return _base(cfg, attention, rope, moe, _all_moe(cfg))


def _qwen_layers(cfg: Cfg) -> list[LayerSpec]:
    """A layer is sparse unless listed in `mlp_only_layers` or off the `decoder_sparse_step` grid."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    experts = _num_experts(cfg) if ("num_experts" in cfg or "num_local_experts" in cfg) else 0
    dense_i = int(cfg.get("intermediate_size") or 0)
    return [
        LayerSpec(i, is_moe=(i not in dense_only and experts > 0 and (i + 1) % step == 0), dense_intermediate=dense_i)
        for i in range(int(_require(cfg, "num_hidden_layers")))
    ]


def _reject_sliding(cfg: Cfg) -> None:
    if cfg.get("use_sliding_window"):
        raise CheckpointError(
            f"{cfg['model_type']} with use_sliding_window=true is not supported; set it to false in config.json"
        )


def qwen2_moe(cfg: Cfg) -> ModelSpec:
    _reject_sliding(cfg)
    attention, rope = _gqa(cfg)
    attention = GQASpec(**{**attention.__dict__, "sliding_window": None})
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    moe = MoESpec(
        num_experts=_num_experts(cfg),
        intermediate_size=int(_require(cfg, "moe_intermediate_size")),
        router=_softmax_router(cfg, renormalize=bool(cfg.get("norm_topk_prob", False))),
        shared_intermediate_size=shared,
        shared_gate=shared > 0,
    )
    return _base(cfg, attention, rope, moe, _qwen_layers(cfg))


def qwen3_moe(cfg: Cfg) -> ModelSpec:
    _reject_sliding(cfg)
    attention, rope = _gqa(cfg, qk_norm="per_head")
    attention = GQASpec(**{**attention.__dict__, "sliding_window": None})
    moe = MoESpec(
        num_experts=_num_experts(cfg),
        intermediate_size=int(_require(cfg, "moe_intermediate_size")),
        router=_softmax_router(cfg, renormalize=bool(cfg.get("norm_topk_prob", False))),
    )
    return _base(cfg, attention, rope, moe, _qwen_layers(cfg))


def deepseek_v3(cfg: Cfg) -> ModelSpec:
    mla = MLASpec(
        num_heads=int(_require(cfg, "num_attention_heads")),
        q_lora_rank=cfg.get("q_lora_rank"),
        kv_lora_rank=int(_require(cfg, "kv_lora_rank")),
        qk_nope_head_dim=int(_require(cfg, "qk_nope_head_dim")),
        qk_rope_head_dim=int(_require(cfg, "qk_rope_head_dim")),
        v_head_dim=int(_require(cfg, "v_head_dim")),
    )
    rope = rope_from_config(cfg, mla.qk_rope_head_dim, interleave=bool(cfg.get("rope_interleave", True)))
    moe_i = int(_require(cfg, "moe_intermediate_size"))
    router = RouterSpec(
        score="sigmoid",
        top_k=int(_require(cfg, "num_experts_per_tok")),
        renormalize=bool(cfg.get("norm_topk_prob", True)),
        n_group=int(cfg.get("n_group", 8) or 1),  # missing keys take transformers' defaults
        topk_group=int(cfg.get("topk_group", 4) or 1),
        has_selection_bias=True,
        scaling_factor=float(cfg.get("routed_scaling_factor", 2.5) or 1.0),
    )
    moe = MoESpec(
        num_experts=int(_require(cfg, "n_routed_experts")),
        intermediate_size=moe_i,
        router=router,
        shared_intermediate_size=moe_i * int(cfg.get("n_shared_experts") or 0),
    )
    first_dense = int(cfg.get("first_k_dense_replace", 3) or 0)
    dense_i = int(_require(cfg, "intermediate_size"))
    layers = [
        LayerSpec(i, is_moe=i >= first_dense, dense_intermediate=dense_i)
        for i in range(int(_require(cfg, "num_hidden_layers")))
    ]
    return _base(cfg, mla, rope, moe, layers)


ADAPTERS: dict[str, Callable[[Cfg], ModelSpec]] = {
    "mixtral": mixtral,
    "qwen2_moe": qwen2_moe,
    "qwen3_moe": qwen3_moe,
    "olmoe": olmoe,
    "deepseek_v3": deepseek_v3,
}


def spec_from_config(cfg: Cfg) -> ModelSpec:
    model_type = cfg.get("model_type")
    if model_type not in ADAPTERS:
        supported = ", ".join(sorted(ADAPTERS))
        raise CheckpointError(f"unsupported model_type '{model_type}' (supported: {supported})")
    spec = ADAPTERS[model_type](cfg)
    _check_router(spec)
    return spec


def _check_router(spec: ModelSpec) -> None:
    r, e = spec.moe.router, spec.moe.num_experts
    if not spec.moe_layers:
        return
    if not 1 <= r.top_k <= e:
        raise CheckpointError(f"num_experts_per_tok={r.top_k} must be between 1 and the {e} experts")
    if e % r.n_group or not 1 <= r.topk_group <= r.n_group:
        raise CheckpointError(f"n_group={r.n_group}, topk_group={r.topk_group} do not fit {e} experts")
