"""Paged decode attention on CPU: one query token per sequence over its cached keys and values,
read in place through the block table (no gathered copy of the context).

  q [B, H, Dh] ── K, V pools [rows, Hkv, Dh], block_tables [B, nb], context_lens [B] ──► out [B, H, Dh]

Row of position i of sequence b: block_tables[b, i // block_size] * block_size + i % block_size.
Grouped-query heads: query head h reads kv head h // (H / Hkv). `window` > 0 keeps the last
`window` positions (sliding-window attention). fp32 throughout. Twin: `decode_attention_ref`
(gather the blocks, then masked `scaled_dot_product_attention`), which the model uses elsewhere.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from moetune.kernels.cpu.runtime import launch, numpy_view


def _check(q, k_pool, v_pool, block_tables, context_lens, block_size: int) -> None:
    """Shapes and dtypes only (no tensor reads): the lengths are checked by `_lengths`."""
    tensors = (q, k_pool, v_pool)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != 3 for t in tensors):
        raise ValueError("q, k_pool and v_pool must be 3-D fp32 CPU tensors")
    B, H, Dh = q.shape
    if k_pool.shape != v_pool.shape or k_pool.shape[2] != Dh or H % k_pool.shape[1]:
        raise ValueError(f"pools {tuple(k_pool.shape)} / {tuple(v_pool.shape)} do not fit q {tuple(q.shape)}")
    if block_tables.shape[0] != B or context_lens.shape != (B,):
        raise ValueError("block_tables must be [B, nb] and context_lens [B]")


def _lengths(context_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> np.ndarray:
    """The context lengths as int64 numpy [B], checked to fit the tables."""
    lens = context_lens.to(torch.int64).contiguous().numpy()  # [B]
    if lens.size and (lens.min() < 1 or lens.max() > block_tables.shape[1] * block_size):
        raise ValueError("every context length must be in [1, blocks in the table × block_size]")
    return lens


class DecodePlan(NamedTuple):
    """What a call derives from the step's block tables and context lengths: the same in every
    layer, so a decode step makes it once (`decode_plan`) and passes it to each layer's call. numpy,
    not torch: each torch op costs tens of µs on the caches a weight-streaming kernel just flushed
    (docs/cpu.md), and a step makes this in every layer otherwise. A record of `records.py`'s kind:
    the fused decode layer's kernel takes it as it is (`_jit_layer.attention_block`)."""
    tables: np.ndarray  # [B, nb] int64 block ids
    lens: np.ndarray  # [B] int64 context lengths, checked against the tables
    block_size: int
    window: int
    scores: np.ndarray  # [B * Hkv, G, longest] fp32 scratch, overwritten by every call
    read: int  # K and V bytes a call reads


def decode_plan(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, window: int,
                num_heads: int, num_kv_heads: int, head_dim: int) -> DecodePlan:
    """The plan of `decode_attention` calls over these sequences (block_tables [B, nb], context_lens [B])."""
    if block_tables.dim() != 2 or context_lens.shape != (block_tables.shape[0],) or num_heads % num_kv_heads:
        raise ValueError("block_tables must be [B, nb], context_lens [B], and the kv heads must divide the heads")
    lens = _lengths(context_lens, block_tables, block_size)  # [B]
    B = lens.size
    longest = int(lens.max()) if B else 0
    longest = longest if window <= 0 else min(longest, window)
    scores = np.empty((B * num_kv_heads, num_heads // num_kv_heads, longest), np.float32)
    read = int(lens.sum()) * num_kv_heads * head_dim * 8  # fp32 K and V
    return DecodePlan(block_tables.to(torch.int64).contiguous().numpy(), lens, block_size, window, scores, read)


def decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, block_size: int, scale: float, window: int = 0,
                     threads: int | None = None, plan: DecodePlan | None = None) -> torch.Tensor:
    """q [B, H, Dh] fp32 → [B, H, Dh]: softmax(q·Kᵀ·scale)·V over each sequence's cached positions.
    `plan`: `decode_plan` of these tables, lengths, block size, window and head counts (made here
    when None)."""
    _check(q, k_pool, v_pool, block_tables, context_lens, block_size)
    B, H, Dh = q.shape
    if plan is None:
        plan = decode_plan(block_tables, context_lens, block_size, window, H, k_pool.shape[1], Dh)
    elif plan.scores.shape[:2] != (B * k_pool.shape[1], H // k_pool.shape[1]) or plan.lens.size != B \
            or plan.block_size != block_size or plan.window != window:
        raise ValueError("the plan was made for other sequences, heads, block size or window")
    out = torch.empty_like(q)  # [B, H, Dh]
    if B == 0:
        return out
    with launch(threads, plan.read) as k:
        k.decode_attention(numpy_view(q), numpy_view(k_pool), numpy_view(v_pool), plan.tables, plan.lens,
                           block_size, float(scale), int(window), plan.scores, out.numpy())
    return out


def decode_attention_ref(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                         context_lens: torch.Tensor, block_size: int, scale: float, window: int = 0,
                         threads: int | None = None) -> torch.Tensor:
    """Twin of `decode_attention`: gather each sequence's blocks, mask, `scaled_dot_product_attention`."""
    _check(q, k_pool, v_pool, block_tables, context_lens, block_size)
    _lengths(context_lens, block_tables, block_size)
    B, S = q.shape[0], int(context_lens.max()) if q.shape[0] else 0
    if B == 0:
        return torch.empty_like(q)
    blocks = block_tables[:, : -(-S // block_size)].long()  # [B, nb]
    rows = (blocks[:, :, None] * block_size + torch.arange(block_size)).reshape(B, -1)[:, :S]  # [B, S]
    k, v = k_pool[rows], v_pool[rows]  # [B, S, Hkv, Dh] each
    cols = torch.arange(S)[None, :]  # [1, S]
    ctx = context_lens.long()[:, None]  # [B, 1]
    mask = cols < ctx
    if window > 0:
        mask &= cols >= ctx - window
    o = F.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True)
    return o[:, :, 0, :]  # [B, H, Dh]
