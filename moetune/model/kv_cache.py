"""Paged KV cache: a pool of fixed-size blocks per layer; sequences own blocks through block tables.

GQA layers keep K and V ([blocks * block_size, H_kv, Dh] each); MLA layers keep the compressed
latent ([..., kv_lora_rank]) and the shared rotary key ([..., rope_dim]) — the point of MLA. The
engine's BlockManager decides which blocks a sequence owns; this class only stores and reads.

Blocks are numbered 1..num_blocks; block 0 is a null block of zeros that pads block tables. The
pool is allocated uninitialised (on CPU its pages are committed only as they are used) and each
block is zeroed when it is handed to a sequence, so a masked position never holds a NaN.
"""

from __future__ import annotations

import torch

from moetune.kernels.cpu.records import KVPools
from moetune.model.batch import StepBatch
from moetune.model.hugepages import huge_empty
from moetune.spec import GQASpec, MLASpec, ModelSpec


class PagedKVCache:
    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype):
        self.num_blocks, self.block_size = num_blocks, block_size
        shapes = entry_shapes(spec.attention)
        rows = (num_blocks + 1) * block_size  # + the null block 0
        self.layers = [tuple(_pool((rows, *shape), device, dtype) for shape in shapes) for _ in range(spec.num_layers)]
        self.zero_blocks([0])
        self._kernel_pools: dict[int, KVPools] = {}  # `kernel_pools`, made on first use

    def kernel_pools(self, layer: int) -> KVPools:
        """Layer `layer`'s K and V pools as the fused decode layer's kernel takes them (numpy views of
        a GQA layer's fp32 CPU pools, made once per cache and layer)."""
        got = self._kernel_pools.get(layer)
        if got is None:
            k, v = self.layers[layer]
            got = self._kernel_pools[layer] = KVPools(k.numpy(), v.numpy())
        return got

    def zero_blocks(self, blocks: list[int]) -> None:
        """Clear blocks just handed out (stale or uninitialised contents)."""
        index = torch.tensor(blocks, device=self.layers[0][0].device)
        for entries in self.layers:
            for pool in entries:
                pool.view(-1, self.block_size, *pool.shape[1:]).index_fill_(0, index, 0)

    def write(self, layer: int, batch: StepBatch, *entries: torch.Tensor) -> None:
        """Store each entry ([T, ...]) at its token's cache row."""
        for pool, new in zip(self.layers[layer], entries):
            pool.index_copy_(0, batch.slot_mapping, new.to(pool.dtype))

    def gather(self, layer: int, block_tables: torch.Tensor, length: int) -> tuple[torch.Tensor, ...]:
        """[B, length, ...] per entry: the first `length` tokens of each sequence's blocks (one
        index_select of whole blocks, each a contiguous copy)."""
        B, bs = block_tables.shape[0], self.block_size
        blocks = block_tables[:, : (length + bs - 1) // bs].reshape(-1)  # [B*nb]
        out = []
        for pool in self.layers[layer]:
            paged = pool.view(-1, bs * pool[0].numel())  # [N+1, bs*entry]
            out.append(paged.index_select(0, blocks).view(B, -1, *pool.shape[1:])[:, :length])  # [B, length, ...]
        return tuple(out)

    def read(self, layer: int, batch: StepBatch, b: int, length: int) -> tuple[torch.Tensor, ...]:
        """[length, ...] per entry for sequence b of the batch."""
        return tuple(t[0] for t in self.gather(layer, batch.block_tables[b : b + 1], length))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for entries in self.layers for t in entries)


def _pool(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Uninitialised; on the CPU in huge pages (attention reads blocks scattered over the pool)."""
    if torch.device(device).type == "cpu":
        return huge_empty(shape, dtype)
    return torch.empty(shape, device=device, dtype=dtype)


def entry_shapes(attention: GQASpec | MLASpec) -> list[tuple[int, ...]]:
    if isinstance(attention, MLASpec):
        return [(attention.kv_lora_rank,), (attention.qk_rope_head_dim,)]
    return [(attention.num_kv_heads, attention.head_dim)] * 2


def bytes_per_token(spec: ModelSpec, dtype: torch.dtype) -> int:
    """KV-cache bytes one token takes over all layers."""
    per_layer = sum(torch.Size(shape).numel() for shape in entry_shapes(spec.attention))
    return per_layer * spec.num_layers * torch.empty((), dtype=dtype).element_size()
