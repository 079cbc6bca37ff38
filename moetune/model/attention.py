"""Grouped-query attention with optional q/k RMSNorm (per head or over the projection) and qkv clipping."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moetune.kernels.cpu import records
from moetune.kernels.cpu.attention import DecodePlan, decode_attention, decode_plan
from moetune.model.batch import StepBatch
from moetune.model.kv_cache import PagedKVCache
from moetune.model.linear import Linear  # noqa: F401  (re-exported: Linear used to live here)
from moetune.model.norm import RMSNorm, kernel_norm
from moetune.model.rope import Rotary
from moetune.spec import GQASpec


class GQAAttention:
    def __init__(self, layer: int, spec: GQASpec, qkv: Linear, o: Linear,
                 q_norm: RMSNorm | None, k_norm: RMSNorm | None, rotary: Rotary, decode_kernel: bool = False,
                 qk_split=None):
        """qkv: the q, k and v projections fused (`Linear.fused`), output [H*Dh | Hkv*Dh | Hkv*Dh].
        decode_kernel: one-token sequences read the paged cache in place through the CPU kernel
        (fp32 CPU models under the `cpu` backend) instead of gathering it for SDPA.
        qk_split: a q/k norm over the whole projection whose heads are split over a TP group
        (model/tp_norm.py `SplitQKNorm`: the norms of the group's parts together); None: q_norm, k_norm."""
        self.layer, self.spec = layer, spec
        self.decode_kernel = decode_kernel
        self.qkv, self.o = qkv, o
        self.q_norm, self.k_norm = q_norm, k_norm
        self.qk_split = qk_split
        self.rotary = rotary
        self.scale = spec.head_dim**-0.5
        kv = spec.num_kv_heads * spec.head_dim
        self.split = [spec.num_heads * spec.head_dim, kv, kv]

    def tensors(self) -> list[torch.Tensor]:
        parts = [self.qkv, self.o, self.q_norm, self.k_norm]
        return [t for part in parts if part is not None for t in part.tensors()]

    def kernel_record(self) -> records.Attention:
        """This layer's weights and settings as the fused decode layer's kernel takes them (fp32 CPU
        weights: views; made once per layer, `model/fused_decode.py`)."""
        s = self.spec
        return records.Attention(self.qkv.kernel_record(), self.o.kernel_record(), s.num_heads, s.num_kv_heads,
                                 s.head_dim, records.QK_KINDS[s.qk_norm], kernel_norm(self.q_norm),
                                 kernel_norm(self.k_norm), float(s.clip_qkv or 0.0), float(self.scale))

    def __call__(self, x: torch.Tensor, batch: StepBatch, cache: PagedKVCache, cos, sin) -> torch.Tensor:
        T, s = x.shape[0], self.spec
        qkv = self.qkv(x)  # [T, H*Dh + 2*Hkv*Dh]
        if s.qk_norm == "none" and s.clip_qkv is None:  # q and k rotated in one call, in place
            H, Hkv = s.num_heads, s.num_kv_heads
            heads = qkv.view(T, H + 2 * Hkv, s.head_dim)  # [T, H + 2Hkv, Dh]
            self.rotary.apply_(heads[:, : H + Hkv], cos, sin)
            q, k, v = heads[:, :H], heads[:, H : H + Hkv], heads[:, H + Hkv :]  # [T, H|Hkv|Hkv, Dh]
        else:
            q, k, v = self._normed_heads(qkv, cos, sin)
        cache.write(self.layer, batch, k, v)
        d = batch.num_single
        if 0 < d == T:  # a decode step: every sequence computes one token (no copy into a buffer)
            return self.o(self._attend_single(q, batch, cache).reshape(T, -1))  # [T, D]
        out = torch.empty_like(q)  # [T, H, Dh]
        if d:
            out[:d] = self._attend_single(q[:d], batch, cache)
        for b in range(d, batch.num_seqs):
            self._attend_seq(q, k, v, b, batch, cache, out)
        return self.o(out.reshape(T, -1))  # [T, D]

    def _normed_heads(self, qkv: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, Dh], k, v [T, Hkv, Dh] with the q/k norms and the clip applied, q and k rotated."""
        T, s = qkv.shape[0], self.spec
        q, k, v = qkv.split(self.split, dim=-1)  # [T, H*Dh], [T, Hkv*Dh], [T, Hkv*Dh]
        if s.qk_norm == "full":
            q, k = (self.q_norm(q), self.k_norm(k)) if self.qk_split is None else self.qk_split(q, k)
        if s.clip_qkv is not None:
            q, k, v = (t.clamp(-s.clip_qkv, s.clip_qkv) for t in (q, k, v))
        q = q.view(T, s.num_heads, s.head_dim)  # [T, H, Dh]
        k = k.view(T, s.num_kv_heads, s.head_dim)  # [T, Hkv, Dh]
        v = v.view(T, s.num_kv_heads, s.head_dim)  # [T, Hkv, Dh]
        if s.qk_norm == "per_head":
            q, k = self.q_norm(q), self.k_norm(k)
        return self.rotary.apply_(q, cos, sin), self.rotary.apply_(k, cos, sin), v  # in place: q, k are fresh

    def decode_plan(self, batch: StepBatch, B1: int, block_size: int) -> DecodePlan:
        """The decode attention plan of the step's B1 leading one-token sequences: made by the first
        layer that asks (unfused or fused), the same object for every layer of the same window."""
        s, window = self.spec, self.spec.sliding_window or 0
        return batch.memo(("decode_plan", B1, block_size, window, s.num_heads, s.num_kv_heads, s.head_dim),
                          lambda: decode_plan(batch.block_tables[:B1], batch.context_tensor()[:B1], block_size,
                                              window, s.num_heads, s.num_kv_heads, s.head_dim))

    def plan_shape(self) -> tuple[int, int, int, int]:
        """What a decode plan depends on besides the step and block size: (window or 0, heads, kv
        heads, head dim); layers alike in these share one plan per step."""
        s = self.spec
        return (s.sliding_window or 0, s.num_heads, s.num_kv_heads, s.head_dim)

    def row_plan(self, batch: StepBatch, block_size: int) -> DecodePlan:
        """The decode attention plan of every row of a step whose rows all end their sequences'
        contexts (a decode or verify step: no prompt rows), one query per row: row t reads its
        sequence's cache up to and including its own position (positions[t] + 1 keys). The fused
        layer writes every row's keys and values before attending, so a verify entry's rows attend
        causally among themselves, as `_attend_seq`'s causal mask makes them. A decode step's rows
        are its sequences: then `decode_plan` itself."""
        T = batch.input_ids.shape[0]
        if batch.num_single == T:
            return self.decode_plan(batch, T, block_size)
        s, window = self.spec, self.spec.sliding_window or 0
        return batch.memo(("row_plan", block_size, window, s.num_heads, s.num_kv_heads, s.head_dim),
                          lambda: decode_plan(batch.row_tables(), batch.positions + 1, block_size, window,
                                              s.num_heads, s.num_kv_heads, s.head_dim))

    def _attend_single(self, q: torch.Tensor, batch: StepBatch, cache: PagedKVCache) -> torch.Tensor:
        """The leading sequences with one query token each, batched: q [B1, H, Dh] → [B1, H, Dh]."""
        B1 = q.shape[0]
        if self.decode_kernel:
            k_pool, v_pool = cache.layers[self.layer]  # [rows, Hkv, Dh] each
            tables, lens = batch.block_tables[:B1], batch.context_tensor()[:B1]
            plan = self.decode_plan(batch, B1, cache.block_size)
            return decode_attention(q, k_pool, v_pool, tables, lens, cache.block_size, self.scale, plan.window,
                                    plan=plan)
        ctx = batch.context_tensor()[:B1, None]  # [B1, 1]
        S = max(batch.context_lens[:B1])
        k, v = cache.gather(self.layer, batch.block_tables[:B1], S)  # [B1, S, Hkv, Dh] each
        cols = torch.arange(S, device=q.device)[None, :]  # [1, S]
        mask = cols < ctx  # [B1, S]
        if self.spec.sliding_window:
            mask &= cols >= ctx - self.spec.sliding_window
        o = F.scaled_dot_product_attention(
            q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask[:, None, None, :], scale=self.scale, enable_gqa=True,
        )  # [B1, H, 1, Dh]
        return o[:, :, 0, :]

    def _attend_seq(self, q, k_new, v_new, b: int, batch: StepBatch, cache: PagedKVCache, out) -> None:
        """Sequence b's n query tokens over its ctx keys: this step's keys when the whole context is
        new (a fresh prompt), else the cache's."""
        start, n, ctx = batch.starts()[b], batch.query_lens[b], batch.context_lens[b]
        if n == ctx:
            k, v = k_new[start : start + n], v_new[start : start + n]  # [n, Hkv, Dh] each
        else:
            k, v = cache.read(self.layer, batch, b, ctx)  # [ctx, Hkv, Dh] each
        plain_causal = n == ctx and not (self.spec.sliding_window and ctx > self.spec.sliding_window)
        mask = None if plain_causal else causal_mask(n, ctx, self.spec.sliding_window, q.device)  # [n, ctx]
        # 4-D with a batch of one: torch's CPU SDPA takes its flash kernel only for 4-D inputs
        # (3-D fell to the math path: 4x slower on a 512-token prompt)
        o = F.scaled_dot_product_attention(
            q[None, start : start + n].transpose(1, 2), k[None].transpose(1, 2), v[None].transpose(1, 2),
            attn_mask=mask, is_causal=plain_causal, scale=self.scale, enable_gqa=True,
        )  # [1, H, n, Dh]
        out[start : start + n] = o[0].transpose(0, 1)


def causal_mask(n: int, ctx: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[n, ctx] bool: query i (absolute position ctx - n + i) sees keys j <= its position."""
    rows = torch.arange(ctx - n, ctx, device=device)[:, None]  # [n, 1]
    cols = torch.arange(ctx, device=device)[None, :]  # [1, ctx]
    mask = cols <= rows
    if window:
        mask &= cols > rows - window
    return mask
