"""Which slice of each checkpoint tensor a tensor-parallel rank holds, read from the mmap'd file alone.

`ShardedSource` answers the loader's `get(name)` with this rank's part of the tensor (model/tp.py
says which parts are split); only that part is read from the safetensors file (`WeightSource.part`),
so no rank materialises a split tensor whole. Tensors not split (norms, routers, MLA's latent
down-projection, a part the plan keeps whole) are read as they are.
"""

from __future__ import annotations

import re

import torch

from moetune.model.tp import TPPlan
from moetune.model.weights import WeightSource
from moetune.spec import GQASpec, ModelSpec

_ATTN = r"\.self_attn\."
_EXPERT_IN = r"(\.experts\.\d+\.(gate_proj|up_proj|w1|w3)\.weight$)"
_EXPERT_OUT = r"(\.experts\.\d+\.(down_proj|w2)\.weight$)"
_SHARED = r"\.(shared_expert|shared_experts)\."
_DENSE = r"^model\.layers\.\d+\.mlp\."


class ShardedSource:
    """A WeightSource whose `get` returns rank `plan.rank`'s slice of split tensors."""

    def __init__(self, source: WeightSource, spec: ModelSpec, plan: TPPlan):
        self.inner, self.spec, self.plan = source, spec, plan
        self.device, self.dtype, self.model_dir = source.device, source.dtype, source.model_dir

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def names(self) -> list[str]:
        return self.inner.names()

    def raw(self, name: str) -> torch.Tensor:
        return self.inner.raw(name)

    def get_optional(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        return self.get(name, dtype) if self.has(name) else None

    def first(self, *names: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.get(next((n for n in names if self.has(n)), names[0]), dtype)

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        index = self.index(name)
        if index is None:
            return self.inner.get(name, dtype)
        if index == "zero":  # a row-parallel bias: added once, by rank 0
            return torch.zeros_like(self.inner.get(name, dtype))
        if isinstance(index, list):  # several row ranges (a fused gate_up), concatenated
            return torch.cat([self.inner.part(name, part, dtype) for part in index], dim=1)
        return self.inner.part(name, index, dtype)

    def index(self, name: str):
        """This rank's slice of `name`: a tuple of slices, a list of them (concatenated along dim 1),
        "zero" (rank ≠ 0's share of a row-parallel bias), or None (the tensor whole)."""
        p = self.plan
        if p.attention:
            got = self._attention(name) if re.search(_ATTN, name) else None
            if got is not None:
                return got
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                return self._rows(self.spec.vocab_size)
            if re.search(_DENSE + r"(gate_proj|up_proj)\.weight$", name):
                return self._rows(self._dense_intermediate(name))
            if re.search(_DENSE + r"down_proj\.weight$", name):
                return self._cols(self._dense_intermediate(name))
        if p.experts:
            return self._experts(name)
        return None

    def _attention(self, name: str):
        att, p = self.spec.attention, self.plan
        proj = name.split(".self_attn.")[1]
        if isinstance(att, GQASpec):
            Dh = att.head_dim
            if proj.startswith("q_proj."):
                return self._rows(att.num_heads * Dh)
            if proj.startswith(("k_proj.", "v_proj.")):
                first, stop = p.kv_heads(att.num_kv_heads)
                return (slice(first * Dh, stop * Dh),)
            if proj == "o_proj.weight":
                return self._cols(att.num_heads * Dh)
            if att.qk_norm == "full" and proj == "q_norm.weight":  # over the whole projection: this rank's part
                return self._rows(att.num_heads * Dh)
            if att.qk_norm == "full" and proj == "k_norm.weight":
                first, stop = p.kv_heads(att.num_kv_heads)
                return (slice(first * Dh, stop * Dh),)
        else:
            H = att.num_heads
            if proj in ("q_proj.weight", "q_b_proj.weight"):
                return self._rows(H * att.qk_head_dim)
            if proj == "kv_b_proj.weight":
                return self._rows(H * (att.qk_nope_head_dim + att.v_head_dim))
            if proj == "o_proj.weight":
                return self._cols(H * att.v_head_dim)
        if proj == "o_proj.bias":
            return None if p.rank == 0 else "zero"
        return None

    def _experts(self, name: str):
        I = self.spec.moe.intermediate_size
        if re.search(_EXPERT_IN, name):
            return self._rows(I)
        if re.search(_EXPERT_OUT, name):
            return self._cols(I)
        if name.endswith(".experts.gate_up_proj"):  # [E, 2I, D]: this rank's gate rows, then its up rows
            a, b = self.plan.part(I)
            return [(slice(None), slice(a, b)), (slice(None), slice(I + a, I + b))]
        if name.endswith(".experts.down_proj"):  # [E, D, I]
            a, b = self.plan.part(I)
            return (slice(None), slice(None), slice(a, b))
        if re.search(_SHARED + r"(gate_proj|up_proj)\.weight$", name):
            return self._rows(self.spec.moe.shared_intermediate_size)
        if re.search(_SHARED + r"down_proj\.weight$", name):
            return self._cols(self.spec.moe.shared_intermediate_size)
        return None

    def _dense_intermediate(self, name: str) -> int:
        return self.spec.layers[int(name.split(".")[2])].dense_intermediate

    def _rows(self, n: int) -> tuple[slice]:
        a, b = self.plan.part(n)
        return (slice(a, b),)

    def _cols(self, n: int) -> tuple[slice, slice]:
        a, b = self.plan.part(n)
        return (slice(None), slice(a, b))
