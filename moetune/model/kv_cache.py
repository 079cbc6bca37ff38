"""Contiguous KV cache: one slot per live sequence, `max_len` positions per slot.

GQA layers keep K and V ([slots, S, H_kv, Dh] each); MLA layers keep the compressed latent
([slots, S, kv_lora_rank]) and the shared rotary key ([slots, S, rope_dim]) — the point of MLA.
"""

from __future__ import annotations

import torch

from moetune.model.batch import StepBatch
from moetune.model.spec import GQASpec, MLASpec, ModelSpec


class KVCache:
    def __init__(self, spec: ModelSpec, num_slots: int, max_len: int, device: torch.device, dtype: torch.dtype):
        self.max_len = max_len
        self.num_slots = num_slots
        shapes = _entry_shapes(spec.attention)
        self.layers = [
            tuple(torch.zeros(num_slots, max_len, *shape, device=device, dtype=dtype) for shape in shapes)
            for _ in range(spec.num_layers)
        ]

    def write(self, layer: int, batch: StepBatch, *entries: torch.Tensor) -> None:
        """Store each entry ([T, ...]) at its sequence's positions context_len - query_len ..."""
        store = self.layers[layer]
        if batch.is_decode:
            slots, pos = batch.slot_tensor(), batch.context_tensor() - 1
            for cache, new in zip(store, entries):
                cache[slots, pos] = new  # new: [B, ...]
            return
        for b, start in enumerate(batch.starts()):
            q, ctx, slot = batch.query_lens[b], batch.context_lens[b], batch.slots[b]
            for cache, new in zip(store, entries):
                cache[slot, ctx - q : ctx] = new[start : start + q]

    def read(self, layer: int, slot: int, length: int) -> tuple[torch.Tensor, ...]:
        return tuple(cache[slot, :length] for cache in self.layers[layer])

    def read_batch(self, layer: int, batch: StepBatch, length: int) -> tuple[torch.Tensor, ...]:
        """[B, length, ...] per entry: a view when the slots are contiguous, else a gather."""
        span = batch.slot_range()
        if span is not None:
            return tuple(cache[span.start : span.stop, :length] for cache in self.layers[layer])
        return tuple(cache[:, :length].index_select(0, batch.slot_tensor()) for cache in self.layers[layer])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for entries in self.layers for t in entries)


def _entry_shapes(attention: GQASpec | MLASpec) -> list[tuple[int, ...]]:
    if isinstance(attention, MLASpec):
        return [(attention.kv_lora_rank,), (attention.qk_rope_head_dim,)]
    return [(attention.num_kv_heads, attention.head_dim)] * 2
