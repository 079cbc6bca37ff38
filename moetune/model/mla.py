"""Multi-head latent attention (DeepSeek-V2/V3) in the absorbed form.

The cache holds the normalised latent c_kv [S, r] and the shared rotary key [S, dr]. Instead of
expanding c_kv into per-head K and V, W_UK is folded into the query and W_UV into the output:
    score = (q_nope · W_UK) · c_kv + q_rot · k_rot,   out = (softmax · c_kv) · W_UVᵀ
which is the same math with far less memory traffic per decode step.
"""

from __future__ import annotations

import torch

from moetune.model.attention import causal_mask
from moetune.model.linear import Linear
from moetune.model.batch import StepBatch
from moetune.model.kv_cache import PagedKVCache
from moetune.model.norm import RMSNorm
from moetune.model.rope import Rotary, softmax_scale_multiplier
from moetune.spec import MLASpec, RopeSpec


class MLAttention:
    def __init__(self, layer: int, spec: MLASpec, rope: RopeSpec, q_a: Linear | None, q_a_norm: RMSNorm | None,
                 q_b: Linear, kv_a: Linear, kv_a_norm: RMSNorm, kv_b: Linear, o: Linear, rotary: Rotary):
        self.layer, self.spec = layer, spec
        self.q_a_norm, self.q_b = q_a_norm, q_b  # q_b is q_proj when q_lora_rank is None
        self.kv_a_norm, self.o = kv_a_norm, o
        # x is read once for both down-projections: [q_lora | r + dr] (or [r + dr] without a q LoRA)
        self.x_a = Linear.fused([q_a, kv_a], kv_a.small_m) if q_a is not None else kv_a
        self.q_lora = q_a.out_features if q_a is not None else 0
        self.rotary = rotary
        H, r = spec.num_heads, spec.kv_lora_rank
        w = kv_b.weight.view(H, spec.qk_nope_head_dim + spec.v_head_dim, r)  # [H, dn+dv, r]
        self.w_uk = w[:, : spec.qk_nope_head_dim, :]  # [H, dn, r]
        self.w_uv = w[:, spec.qk_nope_head_dim :, :]  # [H, dv, r]
        self.scale = spec.qk_head_dim**-0.5 * softmax_scale_multiplier(rope)

    def tensors(self) -> list[torch.Tensor]:
        parts = [self.x_a, self.q_a_norm, self.q_b, self.kv_a_norm, self.o]
        return [t for part in parts if part is not None for t in part.tensors()] + [self.w_uk, self.w_uv]

    def __call__(self, x: torch.Tensor, batch: StepBatch, cache: PagedKVCache, cos, sin) -> torch.Tensor:
        s, T = self.spec, x.shape[0]
        xa = self.x_a(x)  # [T, q_lora + r + dr]
        ckv = xa[:, self.q_lora :]  # [T, r + dr]
        q = self.q_b(self.q_a_norm(xa[:, : self.q_lora])) if self.q_lora else self.q_b(x)  # [T, H*dqk]
        q = q.view(T, s.num_heads, s.qk_head_dim)
        q_nope, q_rot = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)  # [T, H, dn], [T, H, dr]
        latent = self.kv_a_norm(ckv[:, : s.kv_lora_rank])  # [T, r]
        k_rot = ckv[:, s.kv_lora_rank :].view(T, 1, s.qk_rope_head_dim)  # [T, 1, dr]
        q_rot = self.rotary.apply(q_rot, cos, sin)
        k_rot = self.rotary.apply(k_rot, cos, sin)[:, 0]  # [T, dr]
        cache.write(self.layer, batch, latent, k_rot)
        q_lat = torch.einsum("thn,hnr->thr", q_nope, self.w_uk)  # [T, H, r]
        out = torch.empty(T, s.num_heads, s.kv_lora_rank, dtype=x.dtype, device=x.device)  # [T, H, r]
        d = batch.num_single
        if d:
            out[:d] = self._attend_single(q_lat[:d], q_rot[:d], batch, cache)
        for b in range(d, batch.num_seqs):
            self._attend_seq(q_lat, q_rot, latent, k_rot, b, batch, cache, out)
        o = torch.einsum("thr,hvr->thv", out, self.w_uv)  # [T, H, dv]
        return self.o(o.reshape(T, -1))  # [T, D]

    def _attend_single(self, q_lat, q_rot, batch: StepBatch, cache: PagedKVCache) -> torch.Tensor:
        """Leading one-token sequences, batched: q_lat [B1, H, r], q_rot [B1, H, dr] → [B1, H, r]."""
        B1 = q_lat.shape[0]
        S = max(batch.context_lens[:B1])
        c_kv, k_r = cache.gather(self.layer, batch.block_tables[:B1], S)  # [B1, S, r], [B1, S, dr]
        scores = torch.einsum("bhr,bsr->bhs", q_lat, c_kv) + torch.einsum("bhd,bsd->bhs", q_rot, k_r)
        scores = scores.float() * self.scale  # [B1, H, S]
        keep = torch.arange(S, device=q_lat.device)[None, :] < batch.context_tensor()[:B1, None]  # [B1, S]
        probs = scores.masked_fill(~keep[:, None, :], float("-inf")).softmax(dim=-1).to(q_lat.dtype)
        return torch.einsum("bhs,bsr->bhr", probs, c_kv)

    def _attend_seq(self, q_lat, q_rot, latent, k_rot, b: int, batch: StepBatch, cache: PagedKVCache, out):
        """Sequence b's n queries over its ctx latents (this step's when all are new, else the cache's)."""
        start, n, ctx = batch.starts()[b], batch.query_lens[b], batch.context_lens[b]
        if n == ctx:
            c_kv, k_r = latent[start : start + n], k_rot[start : start + n]  # [n, r], [n, dr]
        else:
            c_kv, k_r = cache.read(self.layer, batch, b, ctx)  # [ctx, r], [ctx, dr]
        scores = torch.einsum("thr,sr->hts", q_lat[start : start + n], c_kv)
        scores = scores + torch.einsum("thd,sd->hts", q_rot[start : start + n], k_r)  # [H, n, ctx]
        scores = scores.float() * self.scale
        scores = scores.masked_fill(~causal_mask(n, ctx, None, q_lat.device), float("-inf"))
        probs = scores.softmax(dim=-1).to(q_lat.dtype)  # [H, n, ctx]
        out[start : start + n] = torch.einsum("hts,sr->thr", probs, c_kv)
