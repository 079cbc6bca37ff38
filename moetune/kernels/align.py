"""Align: topk_ids → token copies sorted by expert, each expert padded to a multiple of BLOCK_M.

Four small launches, deterministic and stable (copies of one expert keep ascending flat order,
like `torch.argsort(stable=True)`), with no host sync:
  1. count   one program per chunk of copies: per-chunk histogram      → chunk_counts [C, E]
  2. prefix  one program: per-chunk bases, counts, (padded) offsets, rows in use
  3. place   one program per chunk: rank among earlier same-expert copies → sorted_token_ids
  4. blocks  expert (mapped to its physical slot, -1 if not on this rank) of every BLOCK_M rows
Twin: `reference.align_block_size_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moetune.kernels.layout import AlignedLayout, max_padded_rows, num_blocks


@triton.jit
def _count_kernel(
    ids_ptr, chunk_counts_ptr,  # [N] expert per copy in; [C, E] copies per expert per chunk out
    N, E,
    BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
):
    chunk = tl.program_id(0)
    offs = chunk * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    ids = tl.load(ids_ptr + offs, mask=offs < N, other=-1)  # [BN]
    experts = tl.arange(0, BLOCK_E)  # [BE]
    hits = (ids[:, None] == experts[None, :]).to(tl.int32)  # [BN, BE]
    tl.store(chunk_counts_ptr + chunk * E + experts, tl.sum(hits, axis=0), mask=experts < E)


@triton.jit
def _prefix_kernel(
    chunk_counts_ptr, chunk_base_ptr,  # [C, E] in; [C, E] out: copies of e in earlier chunks
    counts_ptr, offsets_ptr, padded_offsets_ptr, post_padded_ptr,  # [E], [E+1], [E+1], [1] out
    num_chunks, E,
    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_E: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)  # [BE]
    e_ok = experts < E
    running = tl.zeros([BLOCK_E], tl.int32)  # [BE]
    for c0 in range(0, num_chunks, BLOCK_C):
        chunks = c0 + tl.arange(0, BLOCK_C)  # [BC]
        ptrs = chunks[:, None] * E + experts[None, :]  # [BC, BE]
        ok = (chunks[:, None] < num_chunks) & e_ok[None, :]
        tile = tl.load(chunk_counts_ptr + ptrs, mask=ok, other=0)  # [BC, BE]
        inclusive = tl.cumsum(tile, axis=0)  # [BC, BE]
        tl.store(chunk_base_ptr + ptrs, running[None, :] + inclusive - tile, mask=ok)
        running += tl.sum(tile, axis=0)
    padded = (running + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # [BE]
    tl.store(counts_ptr + experts, running, mask=e_ok)
    tl.store(offsets_ptr + 1 + experts, tl.cumsum(running, axis=0), mask=e_ok)
    tl.store(padded_offsets_ptr + 1 + experts, tl.cumsum(padded, axis=0), mask=e_ok)
    tl.store(post_padded_ptr, tl.sum(padded, axis=0))


@triton.jit
def _place_kernel(
    ids_ptr, chunk_base_ptr, padded_offsets_ptr,  # [N], [C, E], [E+1] in
    sorted_ptr,  # [max_padded] out (pre-filled with the sentinel N)
    N, E,
    BLOCK_N: tl.constexpr,
):
    chunk = tl.program_id(0)
    pos = tl.arange(0, BLOCK_N)  # [BN]
    offs = chunk * BLOCK_N + pos
    ok = offs < N
    ids = tl.load(ids_ptr + offs, mask=ok, other=-1)  # [BN]
    earlier_same = (ids[:, None] == ids[None, :]) & (pos[None, :] < pos[:, None])  # [BN, BN]
    rank = tl.sum(earlier_same.to(tl.int32), axis=1)  # [BN]
    e = tl.where(ok, ids, 0)
    base = tl.load(padded_offsets_ptr + e, mask=ok, other=0) + tl.load(chunk_base_ptr + chunk * E + e, mask=ok, other=0)
    tl.store(sorted_ptr + base + rank, offs.to(tl.int32), mask=ok)


@triton.jit
def _block_expert_kernel(
    padded_offsets_ptr, post_padded_ptr, expert_map_ptr,  # [E+1], [1], [E] (if HAS_MAP) in
    expert_ids_ptr,  # [max_blocks] out
    max_blocks, E,
    HAS_MAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr,
):
    blocks = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    starts = blocks * BLOCK_M  # [BB]
    experts = tl.arange(0, BLOCK_E)
    ends = tl.load(padded_offsets_ptr + 1 + experts, mask=experts < E, other=2**30)  # [BE]
    expert = tl.sum((ends[None, :] <= starts[:, None]).to(tl.int32), axis=1)  # [BB] segment holding the block
    used = starts < tl.load(post_padded_ptr)
    if HAS_MAP:
        expert = tl.load(expert_map_ptr + expert, mask=used, other=-1)
    tl.store(expert_ids_ptr + blocks, tl.where(used, expert, -1), mask=blocks < max_blocks)


def _chunk_size(block_e: int) -> int:
    return max(16, min(128, 8192 // block_e))


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                     expert_map: torch.Tensor | None = None) -> AlignedLayout:
    """topk_ids [T, K] (logical experts) → AlignedLayout; expert_map [E] int: logical → physical
    slot, -1 for experts not on this rank (their blocks get expert id -1)."""
    T, K = topk_ids.shape
    N, E, dev = T * K, num_experts, topk_ids.device
    ids = topk_ids.reshape(-1).contiguous()  # [N]
    block_e = triton.next_power_of_2(E)
    block_n = _chunk_size(block_e)
    chunks = max(1, triton.cdiv(N, block_n))
    max_rows = max_padded_rows(N, E, block_m)
    max_blocks = num_blocks(max_rows, block_m)
    i32 = dict(dtype=torch.int32, device=dev)
    chunk_counts, chunk_base = torch.empty(chunks, E, **i32), torch.empty(chunks, E, **i32)  # [C, E]
    counts = torch.empty(E, **i32)  # [E]
    offsets, padded_offsets = torch.zeros(E + 1, **i32), torch.zeros(E + 1, **i32)  # [E+1]
    post_padded = torch.empty(1, **i32)
    sorted_ids = torch.full((max_rows,), N, **i32)  # [max_padded]
    expert_ids = torch.empty(max_blocks, **i32)  # [max_blocks]
    _count_kernel[(chunks,)](ids, chunk_counts, N, E, BLOCK_N=block_n, BLOCK_E=block_e)
    _prefix_kernel[(1,)](chunk_counts, chunk_base, counts, offsets, padded_offsets, post_padded, chunks, E,
                         BLOCK_M=block_m, BLOCK_C=max(1, min(64, 8192 // block_e)), BLOCK_E=block_e)
    _place_kernel[(chunks,)](ids, chunk_base, padded_offsets, sorted_ids, N, E, BLOCK_N=block_n)
    emap = None if expert_map is None else expert_map.to(**i32).contiguous()
    _block_expert_kernel[(triton.cdiv(max_blocks, 64),)](
        padded_offsets, post_padded, emap if emap is not None else padded_offsets, expert_ids, max_blocks, E,
        HAS_MAP=emap is not None, BLOCK_M=block_m, BLOCK_B=64, BLOCK_E=block_e)
    return AlignedLayout(sorted_ids, expert_ids, post_padded, counts, offsets, padded_offsets, block_m, K)
