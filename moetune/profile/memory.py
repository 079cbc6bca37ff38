"""Memory breakdown: weights (attention/dense vs routed experts), KV cache, activation estimate.

The activation figure is an estimate of the largest step's live buffers, with its formula:
  act_bytes = T_max · b · (4·D + E + K·(2·D + 3·I))
(residual, normed input, attention output, MLP output; router logits; per copy the sorted input,
the expert output and the w13/SiLU intermediates), b = activation dtype bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

ACTIVATION_FORMULA = "T_max · b · (4·D + E + K·(2·D + 3·I))"


@dataclass(frozen=True)
class MemoryBreakdown:
    dense_weight_bytes: int  # attention, norms, embeddings, dense MLPs, shared experts, router
    expert_weight_bytes: int  # routed experts
    kv_cache_bytes: int  # the paged KV pool the engine allocated (blocks × block_size × per-token bytes)
    activation_bytes_estimate: int
    activation_formula: str = ACTIVATION_FORMULA

    def as_dict(self) -> dict:
        return asdict(self)


def memory_breakdown(model, kv_cache_bytes: int, max_tokens_per_step: int) -> MemoryBreakdown:
    weights = model.weight_bytes()
    spec = model.spec
    D, E, K, I = spec.hidden_size, spec.moe.num_experts, spec.moe.router.top_k, spec.moe.intermediate_size
    b = torch.empty((), dtype=model.dtype).element_size()
    act = max_tokens_per_step * b * (4 * D + E + K * (2 * D + 3 * I))
    return MemoryBreakdown(weights["dense"], weights["experts"], kv_cache_bytes, act)
