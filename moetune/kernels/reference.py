"""Plain-torch twins of every kernel in this package, with identical signatures.

Tests compare each kernel with its twin; none of these import triton.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moetune.kernels.configs import GemmConfig
from moetune.kernels.layout import AlignedLayout, RouterParams, max_padded_rows, num_blocks
from moetune.kernels.quant_formats import PackedWeight, dequantize


def select_experts_ref(
    logits: torch.Tensor, spec: RouterParams, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of `router.select_experts`: logits [T, E] fp32 → (topk_weights [T, K] fp32, topk_ids [T, K] int64)."""
    scores = logits.softmax(dim=-1) if spec.score == "softmax" else logits.sigmoid()  # [T, E]
    choice = scores if bias is None else scores + bias.float()  # [T, E]
    if spec.n_group > 1 and spec.topk_group < spec.n_group:
        choice = _mask_to_top_groups(choice, spec.n_group, spec.topk_group)
    ids = torch.topk(choice, spec.top_k, dim=-1).indices  # [T, K]
    weights = scores.gather(1, ids)  # [T, K]
    if spec.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if spec.score == "sigmoid" else 0.0))
    if spec.scaling_factor != 1.0:
        weights = weights * spec.scaling_factor
    return weights, ids


def _mask_to_top_groups(choice: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """Keep experts of the `topk_group` groups whose two best experts score highest; -inf elsewhere."""
    T, E = choice.shape
    grouped = choice.view(T, n_group, E // n_group)  # [T, G, E/G]
    group_scores = grouped.topk(min(2, E // n_group), dim=-1).values.sum(dim=-1)  # [T, G]
    top_groups = group_scores.topk(topk_group, dim=-1).indices  # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top_groups, True)  # [T, G]
    keep = keep[:, :, None].expand(T, n_group, E // n_group).reshape(T, E)  # [T, E]
    return choice.masked_fill(~keep, float("-inf"))


def align_block_size_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                         expert_map: torch.Tensor | None = None) -> AlignedLayout:
    """Twin of `align.align_block_size`: the same buffers, element for element."""
    T, K = topk_ids.shape
    N, E, dev = T * K, num_experts, topk_ids.device
    i32 = dict(dtype=torch.int32, device=dev)
    flat = topk_ids.reshape(-1)  # [N]
    counts = torch.bincount(flat, minlength=E).to(torch.int32)  # [E]
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    offsets = torch.zeros(E + 1, **i32)
    offsets[1:] = counts.cumsum(0)
    padded_offsets = torch.zeros(E + 1, **i32)
    padded_offsets[1:] = padded.cumsum(0)
    max_rows = max_padded_rows(N, E, block_m)
    sorted_ids = torch.full((max_rows,), N, **i32)  # [max_padded]
    order = torch.argsort(flat, stable=True)  # [N]
    expert_of = flat[order]  # [N]
    rank = torch.arange(N, device=dev) - offsets[expert_of].long()  # [N] position inside its expert
    sorted_ids[padded_offsets[expert_of].long() + rank] = order.to(torch.int32)
    used = int(padded.sum())
    block_expert = torch.repeat_interleave(torch.arange(E, device=dev), padded // block_m)  # [used blocks]
    if expert_map is not None:
        block_expert = expert_map.to(dev)[block_expert]
    expert_ids = torch.full((num_blocks(max_rows, block_m),), -1, **i32)
    expert_ids[: used // block_m] = block_expert.to(torch.int32)
    post = torch.tensor([used], **i32)
    return AlignedLayout(sorted_ids, expert_ids, post, counts, offsets, padded_offsets, block_m, K)


def fused_experts_ref(
    x: torch.Tensor, w13: PackedWeight, w2: PackedWeight, layout: AlignedLayout,
    topk_weights: torch.Tensor | None = None, config_up: GemmConfig | None = None,
    config_down: GemmConfig | None = None, out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """Twin of `fused_experts.fused_experts`: dequantise, loop over physical experts, fp32 math,
    the intermediate rounded to x.dtype as the kernel stores it. → [T*K, D] in copy order."""
    T, D = x.shape
    N = T * layout.top_k
    out = torch.empty(N, D, dtype=x.dtype, device=x.device) if out is None else out  # [T*K, D]
    used_blocks = int(layout.num_tokens_post_padded) // layout.block_m
    rows = layout.sorted_token_ids[: used_blocks * layout.block_m].view(used_blocks, layout.block_m).long()
    experts = layout.expert_ids[:used_blocks].long()  # [B]
    valid = rows < N  # [B, BM]
    out[rows[valid & (experts[:, None] < 0)]] = 0
    I = w2.in_features
    w13f, w2f = dequantize(w13), dequantize(w2)  # [P, 2I, D], [P, D, I]
    for e in experts.unique().tolist():
        if e < 0:
            continue
        copies = rows[(experts == e)[:, None] & valid]  # [n_e]
        a = x[copies // layout.top_k].float()  # [n_e, D]
        h = a @ w13f[e].t()  # [n_e, 2I]
        h = (F.silu(h[:, :I]) * h[:, I:]).to(x.dtype).float()  # [n_e, I]
        y = h @ w2f[e].t()  # [n_e, D]
        if topk_weights is not None:
            y = y * topk_weights.reshape(-1)[copies].float()[:, None]
        out[copies] = y.to(out.dtype)
    return out


def combine_ref(y: torch.Tensor, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of `combine.combine`: y [T, K, D] → [T, D], fp32 weighted sum over K."""
    acc = y.float() if topk_weights is None else y.float() * topk_weights.float()[:, :, None]  # [T, K, D]
    return acc.sum(dim=1).to(y.dtype)
