"""A multi-token-prediction (MTP) module in the DeepSeek-V3 checkpoint layout: one extra decoder
block after the target's layers that predicts the token after next from the target's hidden state.

config.json's `num_nextn_predict_layers` counts them; module i's weights sit at layer index
L + i (L = num_hidden_layers): `enorm`, `hnorm`, `eh_proj`, `shared_head.norm`, optionally
`shared_head.head` and `embed_tokens` (else the target's LM head and embedding), and a full
decoder block under the usual names (`self_attn.*`, `mlp.*` dense or MoE, the two norms) — the
names vLLM's deepseek_mtp.py and SGLang's deepseek_nextn.py read. moetune uses module L only.

At position p, given the target's hidden state h_p (after its final norm: what the target's
forward returns, as vLLM hands it over) and the next token t_{p+1}:

    x = eh_proj(cat([enorm(embed(t_{p+1})), hnorm(h_p)]))   (embed zeroed at position 0, as vLLM)
    y = block(x)  (attention over the module's own KV of positions <= p)
    logits = head(shared_head.norm(y))  → a guess at t_{p+2}

Chained drafting feeds y back as the next position's h with the drafted token (vLLM's one-layer
chain). The block's KV lives in a one-layer paged cache of its own (`new_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from moetune.model.batch import StepBatch
from moetune.model.kv_cache import PagedKVCache
from moetune.model.linear import Linear, Weight, project
from moetune.model.norm import RMSNorm
from moetune.model.rope import Rotary
from moetune.model.transformer import DecoderLayer
from moetune.spec import ModelSpec

MTP_NAMES = ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head", "embed_tokens")


@dataclass
class MTPModule:
    spec: ModelSpec  # the target's (this rank's shapes)
    embed: torch.Tensor  # [V, D] the module's own, or the target's
    enorm: RMSNorm
    hnorm: RMSNorm
    eh_proj: Linear  # [D, 2D]
    block: DecoderLayer  # index L; its attention writes layer 0 of the module's own cache
    head_norm: RMSNorm  # shared_head.norm
    head: Weight  # [V, D] shared_head.head, or the target's LM head
    rotary: Rotary  # the target's
    small_m: int = 0

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, previous: torch.Tensor, batch: StepBatch, cache: PagedKVCache) -> torch.Tensor:
        """ids [T] (the token after each row's position), previous [T, D] (the target's hidden state
        at that position, or the module's own output one position back) → the block's output [T, D]
        (before shared_head.norm); writes the rows' KV at batch.slot_mapping."""
        e = self.embed[ids]  # [T, D]
        e = torch.where((batch.positions == 0)[:, None], torch.zeros_like(e), e)
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(previous.to(e.dtype))], dim=-1))  # [T, D]
        cos, sin = self.rotary.cos_sin(batch.positions, x.dtype, max(batch.context_lens, default=0))
        return self.block(x, batch, cache, cos, sin, None)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] (forward's output) → [N, V] fp32."""
        return project(self.head_norm(hidden), self.head, small_m=self.small_m).float()

    def new_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """A one-layer paged cache (the block's attention writes its layer 0)."""
        return PagedKVCache(replace(self.spec, num_layers=1), num_blocks, block_size, self.device, self.embed.dtype)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.enorm.tensors(), *self.hnorm.tensors(), *self.eh_proj.tensors(), *self.block.tensors(),
                *self.head_norm.tensors()]
