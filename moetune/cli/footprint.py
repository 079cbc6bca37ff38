"""Memory a workload will need, estimated from config.json and the safetensors headers alone.

Shown with its parts whenever a workload is refused (`checks.fits`). Formulas (b = bytes per
element of the load dtype, T = tokens in the largest step, C = its context):

  weights      = Σ numel of every checkpoint tensor · b
  kv_cache     = L · slots · max_len · per-position entries · b   (GQA: 2·H_kv·Dh, MLA: kv_lora + rope)
  activations  = T · b · (4·D + E + K·(2·D + 3·I))  +  T · C · 4   (live buffers + one fp32 score matrix)
"""

from __future__ import annotations

import math

from moetune.spec import GQASpec, ModelSpec


def weight_bytes(tensors: dict, dtype_bytes: int) -> int:
    """tensors: name → TensorInfo from the headers (`validate.checkpoint_tensors`)."""
    return sum(math.prod(info.shape) * dtype_bytes for info in tensors.values())


def kv_bytes(spec: ModelSpec, slots: int, max_len: int, dtype_bytes: int) -> int:
    a = spec.attention
    per_position = 2 * a.num_kv_heads * a.head_dim if isinstance(a, GQASpec) else a.kv_lora_rank + a.qk_rope_head_dim
    return spec.num_layers * slots * max_len * per_position * dtype_bytes


def activation_bytes(spec: ModelSpec, tokens: int, context: int, dtype_bytes: int) -> int:
    D, E = spec.hidden_size, spec.moe.num_experts
    K, inter = spec.moe.router.top_k, spec.moe.intermediate_size
    return tokens * dtype_bytes * (4 * D + E + K * (2 * D + 3 * inter)) + tokens * context * 4


def step_parts(spec: ModelSpec, weights: int, slots: int, max_len: int, tokens: int, context: int,
               dtype_bytes: int) -> dict[str, int]:
    return {"weights": weights, "KV cache": kv_bytes(spec, slots, max_len, dtype_bytes),
            "activations": activation_bytes(spec, tokens, context, dtype_bytes)}


def target_parts(target, slots: int, max_len: int, tokens: int, context: int) -> dict[str, int]:
    """`step_parts` of a resolved Target (engine/target.py): its checkpoint's headers and load dtype."""
    b = target.dtype.itemsize
    return step_parts(target.spec, weight_bytes(target.checkpoint.tensors, b), slots, max_len, tokens, context, b)


def profile_host_bytes(spec: ModelSpec, num_requests: int, tokens_per_request: int, measured_steps: int) -> int:
    """Routing trace (one id per token, MoE layer and k) plus the per-step Parquet rows (~48 B each)."""
    Lm, K, E = len(spec.moe_layers), spec.moe.router.top_k, spec.moe.num_experts
    trace = num_requests * tokens_per_request * Lm * K * (1 if E <= 256 else 2)
    rows = measured_steps * max(Lm, 1) * (E + 2 * 16) * 48
    return trace + rows
