"""The `triton` kernel backend: each MoE phase's compute as Triton kernels (`moetune.kernels`).

  router    → kernels.router.select_experts (fused score / group mask / top-k / renormalise)
  permute   → the torch permute (scatter-add counts, stable sort, gather; no host sync)
  experts   → kernels.align.align_block_size over the dispatched rows (segments padded to the
              GEMM's BLOCK_M), then kernels.fused_experts.fused_experts (two grouped GEMMs,
              SiLU·mul fused), writing one output row per input row in the same order
  unpermute → scatter back to copy order + kernels.combine.combine (weighted sum over K) + shared

No phase reads a value back to the host, so a step's MoE layers launch without a sync. The
kernels' ability to gather token-order rows inside the GEMM is not used: the phase outputs keep
one meaning for every backend and dispatcher (see docs/architecture.md §3a), at the cost of one [T*K, D]
gather in permute.

Imported only by `resolve_backend("triton")`, so importing moetune never imports triton. Launch
configs come from tuned JSON files (`moetune tune-kernels`) or a default rule; tables are read
once and cached on the backend object.
"""

from __future__ import annotations

from pathlib import Path

import torch

from moetune.experts.store import ExpertWeights
from moetune.kernels.align import align_block_size
from moetune.kernels.combine import combine
from moetune.kernels.configs import ConfigTable, GemmConfig, default_config, device_name, find_table, nearest
from moetune.kernels.fused_experts import fused_experts
from moetune.kernels.quant_formats import WeightFormat
from moetune.kernels.router import select_experts
from moetune.moe.experts import ExpertsOutput
from moetune.moe.permute import PermuteOutput, permute
from moetune.moe.router import router_logits
from moetune.moe.unpermute import copy_order
from moetune.spec import RouterSpec


class TritonBackend:
    name = "triton"

    def __init__(self, config_dir: Path | None = None):
        self.config_dir = config_dir
        self._tables: dict[tuple, ConfigTable | None] = {}  # (E, N, device, fmt, gemm) → table, read once

    def router_logits(self, x: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor:
        return router_logits(x, gate_weight)

    def select_experts(self, logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        return select_experts(logits, spec, bias)

    def permute(self, x: torch.Tensor, slot_ids: torch.Tensor, num_slots: int) -> PermuteOutput:
        return permute(x, slot_ids, num_slots)

    def experts(self, x: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> ExpertsOutput:
        """x [N, D] rows grouped by slot → y [N, D] in the same order."""
        N, P = x.shape[0], weights.num_slots
        rows = torch.arange(N, device=x.device)  # [N]
        row_slot = torch.searchsorted(offsets[1:], rows, right=True)  # [N] slot of each row
        if not weights.mixed:
            up, down = self.gemm_configs(x.device, P, weights.intermediate_size, N, 1, weights.w13.fmt)
            layout = align_block_size(row_slot[:, None], P, up.block_m)  # one "copy" per row
            return ExpertsOutput(fused_experts(x, weights.w13, weights.w2, layout, None, up, down), up.block_m)
        return self._mixed(x, row_slot, weights)

    def _mixed(self, x: torch.Tensor, row_slot: torch.Tensor, weights: ExpertWeights) -> ExpertsOutput:
        """One fused launch pair per format group over all rows: slots outside the group map to -1
        (their blocks are skipped and their rows come back 0), so the group outputs add up. No host
        read-back, at the cost of one align per group."""
        N, P = x.shape[0], weights.num_slots
        y = torch.zeros(N, weights.hidden_size, dtype=x.dtype, device=x.device)  # [N, D]
        slots = torch.arange(P, device=x.device)  # [P]
        block_m = 0
        for g in weights.groups:
            up, down = self.gemm_configs(x.device, g.size, weights.intermediate_size, N, 1, g.w13.fmt)
            up, down = up.with_block_m(block_m or up.block_m), down.with_block_m(block_m or up.block_m)
            block_m = up.block_m
            inside = (slots >= g.start) & (slots < g.stop)
            emap = torch.where(inside, slots - g.start, -1)  # [P] slot → index in the group, -1 outside
            layout = align_block_size(row_slot[:, None], P, block_m, emap)
            y += fused_experts(x, g.w13, g.w2, layout, None, up, down)  # [N, D], zero outside the group
        return ExpertsOutput(y, block_m)

    def unpermute(self, y_sorted: torch.Tensor, sorted_copy_ids: torch.Tensor, topk_weights: torch.Tensor,
                  shared: torch.Tensor | None) -> torch.Tensor:
        T, K = topk_weights.shape
        out = combine(copy_order(y_sorted, sorted_copy_ids).view(T, K, y_sorted.shape[-1]), topk_weights)  # [T, D]
        return out if shared is None else out + shared

    def gemm_configs(self, device: torch.device, E: int, N: int, M: int, K: int,
                     fmt: WeightFormat = WeightFormat.NONE) -> tuple[GemmConfig, GemmConfig]:
        """(w13 config, w2 config) for M rows of K copies each; both share the w13 BLOCK_SIZE_M."""
        up_table = self._table(E, N, device_name(device), fmt, "up")
        if up_table is None:
            cfg = default_config(M, E, K)
            return cfg, cfg
        up = nearest(up_table, M)
        down_table = self._table(E, N, device_name(device), fmt, "down")
        down = nearest(down_table, M).with_block_m(up.block_m) if down_table else up
        return up, down

    def _table(self, E: int, N: int, device: str, fmt: WeightFormat, gemm: str) -> ConfigTable | None:
        key = (E, N, device, int(fmt), gemm)
        if key not in self._tables:
            self._tables[key] = find_table(E, N, device, fmt, gemm, self.config_dir)
        return self._tables[key]
