"""The decoder-only MoE transformer: embed → L × (attention, MLP or MoE) → norm → LM head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moetune.experts.store import ExpertStore
from moetune.model.attention import GQAAttention
from moetune.model.fused_decode import FusedDecode
from moetune.model.batch import StepBatch
from moetune.model.kv_cache import PagedKVCache
from moetune.model.linear import Weight, project, weight_tensors
from moetune.model.mla import MLAttention
from moetune.model.mlp import GatedMLP
from moetune.model.norm import RMSNorm
from moetune.model.rope import Rotary
from moetune.model.tp import TPComm
from moetune.spec import ModelSpec
from moetune.moe.layer import MoELayer
from moetune.probe import Probe, phase_scope, times_phases
from moetune.tensors import nbytes as tensor_bytes


@dataclass
class DecoderLayer:
    index: int
    attn_norm: RMSNorm
    attention: GQAAttention | MLAttention
    mlp_norm: RMSNorm
    mlp: GatedMLP | MoELayer
    tp: TPComm | None = None  # tensor parallelism: partial outputs of split parts are all-reduced

    def tensors(self) -> list[torch.Tensor]:
        return self.attn_norm.tensors() + self.attention.tensors() + self.mlp_norm.tensors() + self.mlp.tensors()

    def __call__(self, h, batch: StepBatch, cache: PagedKVCache, cos, sin, probe: Probe | None):
        tp = self.tp
        with phase_scope(probe, self.index, "attention"):
            a = self.attention(self.attn_norm(h), batch, cache, cos, sin)  # [T, D]
        h = h + (a if tp is None or not tp.plan.attention else self._reduce(a, probe))
        if isinstance(self.mlp, MoELayer):
            m = self.mlp(self.mlp_norm(h))
            return h + (m if tp is None or not tp.plan.experts else self._reduce(m, probe))
        with phase_scope(probe, self.index, "dense_mlp"):
            m = self.mlp(self.mlp_norm(h))
        return h + (m if tp is None or not tp.plan.attention else self._reduce(m, probe))

    def _reduce(self, x: torch.Tensor, probe: Probe | None) -> torch.Tensor:
        """The sum over the tensor-parallel group of this rank's partial output x [T, D]."""
        with phase_scope(probe, self.index, "tp_allreduce"):
            return self.tp.all_reduce(x, self.index)


class MoETransformer:
    precision = None  # PrecisionTable of the routed experts (set by the loader; None: the load dtype)
    model_dir = None  # the checkpoint directory it was loaded from (set by the loader; its MTP layers: load_mtp)

    def __init__(self, spec: ModelSpec, embed: torch.Tensor, layers: list[DecoderLayer], norm: RMSNorm,
                 lm_head: Weight, rotary: Rotary, experts: ExpertStore, small_m: int = 0,
                 fused: FusedDecode | None = None, tp: TPComm | None = None, local: ModelSpec | None = None):
        self.spec = spec  # the checkpoint's model
        self.local = local or spec  # the shapes this rank computes (its heads and slices under tensor parallelism)
        self.tp = tp
        self.embed = embed  # [V, D] ([V/G, D]: this rank's vocab rows when the embedding is split)
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head  # [V, D] (the embedding itself when tied; packed under dense quantization)
        self.rotary = rotary
        self.experts = experts
        self.small_m = small_m  # rows up to which projections run the CPU decode kernel (model/linear.py)
        self.probe: Probe | None = None
        self.bytes_read = 0  # checkpoint bytes read to build this model (set by the loader)
        self.fused = fused  # decode steps through the fused CPU layer kernels (model/fused_decode.py)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def attach_probe(self, probe: Probe | None) -> None:
        self.probe = probe
        for layer in self.layers:
            if isinstance(layer.mlp, MoELayer):
                layer.mlp.probe = probe

    @torch.inference_mode()
    def forward(self, batch: StepBatch, cache: PagedKVCache) -> torch.Tensor:
        """Hidden states after the final norm for every token of the step: [T, D]."""
        h = self.embed_tokens(batch.input_ids)  # [T, D]
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype, max(batch.context_lens, default=0))  # [T, rot_dim] each
        if self.fused is not None and not times_phases(self.probe) and self.fused.takes(batch):
            return self.norm(self.fused.run(self.layers, h, batch, cache, cos, sin, self.probe))
        for layer in self.layers:
            h = layer(h, batch, cache, cos, sin, self.probe)
        return self.norm(h)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] → [T, D] (a vocab-parallel lookup, all-reduced, when the embedding is split)."""
        if self.tp is None or not self.tp.plan.attention:
            return self.embed[ids]
        with phase_scope(self.probe, -1, "tp_embed"):
            return self.tp.embed(self.embed, ids)

    @torch.inference_mode()
    def idle_forward(self) -> None:
        """Run every MoE layer on zero tokens: an idle data-parallel rank takes part in each layer's
        all-to-all with the ranks that have work (attention and dense layers have nothing to do)."""
        x = self.embed.new_zeros(0, self.spec.hidden_size)  # [0, D]
        for layer in self.layers:
            if isinstance(layer.mlp, MoELayer):
                layer.mlp(x)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] of the rows that sample → [N, V] fp32 (each rank's vocab slice gathered
        when the LM head is split: every rank of the group samples from the same rows)."""
        out = project(hidden, self.lm_head, small_m=self.small_m)  # [N, V] ([N, V/G] split)
        if self.tp is not None and self.tp.plan.attention:
            with phase_scope(self.probe, -1, "tp_gather"):
                out = self.tp.gather_vocab(out)  # [N, V]
        return out.float()

    def new_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        return PagedKVCache(self.local, num_blocks, block_size, self.device, self.dtype)

    def weight_bytes(self) -> dict[str, int]:
        """Resident weight bytes: routed experts (the ExpertStore) and everything else."""
        return {"experts": self.experts.nbytes(), "dense": storage_bytes(self.dense_tensors())}

    def dense_tensors(self) -> list[torch.Tensor]:
        """Every weight outside the ExpertStore (a tied LM head is the embedding itself)."""
        out = [self.embed, *weight_tensors(self.lm_head), *self.norm.tensors()]
        for layer in self.layers:
            out += layer.tensors()
        return out


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of memory behind `tensors`, each byte once (views, tied weights and one arena)."""
    return tensor_bytes(tensors)
