"""Fused router: logits → softmax/sigmoid → (+bias for choice) → group-limited mask → top-k →
renormalise → scale, one program per block of BLOCK_T token rows.

Twin: `reference.select_experts_ref` (same signature). Weights come from the unbiased
scores; the bias only changes which experts win. Top-k is K rounds of row argmax (K is small).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moetune.kernels.layout import RouterParams

_SOFTMAX = tl.constexpr(0)
_SIGMOID = tl.constexpr(1)


@triton.jit
def _scores(logits, col_ok, SCORE: tl.constexpr):
    """[BT, BE] logits (valid columns) → scores, 0 in padded columns."""
    if SCORE == _SOFTMAX:
        shifted = tl.where(col_ok[None, :], logits, float("-inf"))
        e = tl.exp(shifted - tl.max(shifted, axis=1)[:, None])
        return e / tl.sum(e, axis=1)[:, None]
    s = 1.0 / (1.0 + tl.exp(-logits))
    return tl.where(col_ok[None, :], s, 0.0)


@triton.jit
def _keep_top_groups(choice, cols, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """-inf outside the TOPK_GROUP groups whose two best experts (one if GROUP_SIZE == 1) sum highest."""
    group_of = cols // GROUP_SIZE  # [BE], padded columns fall in groups >= N_GROUP
    group_score = tl.full(choice.shape, float("-inf"), tl.float32)  # [BT, BE]: its group's score
    for g in tl.static_range(N_GROUP):
        in_g = tl.where((group_of == g)[None, :], choice, float("-inf"))  # [BT, BE]
        best = tl.argmax(in_g, axis=1)  # [BT]
        score = tl.max(in_g, axis=1)  # [BT]
        if GROUP_SIZE > 1:
            score += tl.max(tl.where(cols[None, :] == best[:, None], float("-inf"), in_g), axis=1)
        group_score = tl.where((group_of == g)[None, :], score[:, None], group_score)
    keep = tl.zeros(choice.shape, tl.int1)
    for _ in tl.static_range(TOPK_GROUP):
        winner = tl.argmax(group_score, axis=1) // GROUP_SIZE  # [BT] group index
        chosen = group_of[None, :] == winner[:, None]  # [BT, BE]
        keep = keep | chosen
        group_score = tl.where(chosen, float("-inf"), group_score)
    return tl.where(keep, choice, float("-inf"))


@triton.jit
def _router_kernel(
    # pointers: logits [T, E] fp32 in; bias [E] fp32 (if HAS_BIAS); weights [T, K] fp32, ids [T, K] int64 out
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    # sizes and row strides (columns are contiguous)
    T, E, stride_lt, stride_wt, stride_it,
    # the routing rule
    scaling_factor, SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, RENORM_EPS: tl.constexpr,
    N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOP_K: tl.constexpr,
    # tiles: BLOCK_E >= E, BLOCK_K >= TOP_K (powers of two)
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    cols = tl.arange(0, BLOCK_E)  # [BE]
    row_ok, col_ok = rows < T, cols < E
    logits = tl.load(logits_ptr + rows[:, None] * stride_lt + cols[None, :],
                     mask=row_ok[:, None] & col_ok[None, :], other=0.0)  # [BT, BE]
    scores = _scores(logits, col_ok, SCORE)  # [BT, BE]
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + cols, mask=col_ok, other=0.0)[None, :]
    choice = tl.where(col_ok[None, :], choice, float("-inf"))
    if N_GROUP > 1:
        choice = _keep_top_groups(choice, cols, N_GROUP, TOPK_GROUP, GROUP_SIZE)
    slots = tl.arange(0, BLOCK_K)  # [BK]
    top_w = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)
    top_i = tl.zeros((BLOCK_T, BLOCK_K), tl.int64)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(choice, axis=1)  # [BT]
        hit = cols[None, :] == best[:, None]  # [BT, BE]
        w = tl.sum(tl.where(hit, scores, 0.0), axis=1)  # [BT]
        top_w = tl.where(slots[None, :] == k, w[:, None], top_w)
        top_i = tl.where(slots[None, :] == k, best[:, None].to(tl.int64), top_i)
        choice = tl.where(hit, float("-inf"), choice)
    if RENORMALIZE:
        top_w = top_w / (tl.sum(top_w, axis=1)[:, None] + RENORM_EPS)
    top_w = top_w * scaling_factor
    out_ok = row_ok[:, None] & (slots[None, :] < TOP_K)
    tl.store(weights_ptr + rows[:, None] * stride_wt + slots[None, :], top_w, mask=out_ok)
    tl.store(ids_ptr + rows[:, None] * stride_it + slots[None, :], top_i, mask=out_ok)


def select_experts(
    logits: torch.Tensor, spec: RouterParams, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp32 → (topk_weights [T, K] fp32, topk_ids [T, K] int64)."""
    T, E = logits.shape
    K = spec.top_k
    if not 1 <= K <= E:
        raise ValueError(f"top_k={K} must be in [1, E={E}]")
    grouped = spec.n_group > 1 and spec.topk_group < spec.n_group
    if grouped and E % spec.n_group:
        raise ValueError(f"E={E} is not divisible by n_group={spec.n_group}")
    logits = logits.float().contiguous()  # [T, E]
    bias = None if bias is None else bias.float().contiguous()  # [E]
    weights = torch.empty(T, K, dtype=torch.float32, device=logits.device)  # [T, K]
    ids = torch.empty(T, K, dtype=torch.int64, device=logits.device)  # [T, K]
    if T == 0:
        return weights, ids
    block_e = triton.next_power_of_2(E)
    block_t = max(1, min(16, 4096 // block_e))
    _router_kernel[(triton.cdiv(T, block_t),)](
        logits, bias if bias is not None else logits, weights, ids,
        T, E, logits.stride(0), weights.stride(0), ids.stride(0),
        float(spec.scaling_factor), SCORE=0 if spec.score == "softmax" else 1, HAS_BIAS=bias is not None,
        RENORMALIZE=spec.renormalize, RENORM_EPS=1e-20 if spec.score == "sigmoid" else 0.0,
        N_GROUP=spec.n_group if grouped else 1, TOPK_GROUP=spec.topk_group if grouped else 1,
        GROUP_SIZE=E // spec.n_group if grouped else E, TOP_K=K,
        BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(K),
    )
    return weights, ids
