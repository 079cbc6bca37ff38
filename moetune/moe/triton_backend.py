"""The `triton` kernel backend: each MoE phase's compute as Triton kernels (`moetune.kernels`).

  router    → kernels.router.select_experts (fused score / group mask / top-k / renormalise)
  permute   → kernels.align.align_block_size (sorted copies padded to the GEMM's BLOCK_M)
  experts   → kernels.fused_experts.fused_experts (two grouped GEMMs, SiLU·mul fused)
  unpermute → kernels.combine.combine (weighted sum over K) + shared expert

Imported only by `resolve_backend("triton")`, so importing moetune never imports triton. Launch
configs come from tuned JSON files (`moetune tune-kernels`) or a default rule; the tables read
are cached on the backend object.
"""

from __future__ import annotations

from pathlib import Path

import torch

from moetune.experts.store import ExpertWeights
from moetune.kernels.align import align_block_size
from moetune.kernels.combine import combine
from moetune.kernels.configs import ConfigTable, GemmConfig, default_config, device_name, find_table, nearest
from moetune.kernels.fused_experts import fused_experts
from moetune.kernels.layout import AlignedLayout
from moetune.kernels.quant_formats import WeightFormat, plain
from moetune.kernels.router import select_experts
from moetune.model.spec import MoESpec, RouterSpec
from moetune.moe.experts import ExpertsOutput
from moetune.moe.permute import PermuteOutput


class TritonBackend:
    name = "triton"

    def __init__(self, config_dir: Path | None = None):
        self.config_dir = config_dir
        self._tables: dict[tuple, ConfigTable | None] = {}  # (E, N, device, gemm) → table, read once

    def select_experts(self, logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        return select_experts(logits, spec, bias)

    def permute(self, x: torch.Tensor, topk_ids: torch.Tensor, spec: MoESpec) -> PermuteOutput:
        """x_sorted stays in token order [T, D]: the grouped GEMM gathers rows through the layout."""
        T, K = topk_ids.shape
        up, _ = self.gemm_configs(x.device, spec.num_experts, spec.intermediate_size, T, K)
        layout = align_block_size(topk_ids, spec.num_experts, up.block_m)
        ids = layout.sorted_token_ids  # [max_padded]
        sorted_copy_ids = ids[ids < T * K].long()  # [T*K] (host sync)
        padded_rows = int(layout.num_tokens_post_padded)  # (host sync) the padding the GEMM really does
        return PermuteOutput(sorted_copy_ids, layout.counts.long(), layout.offsets.long(), x, padded_rows, layout)

    def experts(self, x: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights,
                aligned: AlignedLayout | None = None) -> ExpertsOutput:
        """x [T, D] token order → y [T*K, D] in copy order (t * K + k)."""
        if aligned is None:
            raise ValueError("the triton experts phase needs the aligned layout from its permute phase")
        E, I = aligned.counts.shape[0], weights.w2.shape[2]
        up, down = self.gemm_configs(x.device, E, I, x.shape[0], aligned.top_k)
        y = fused_experts(x, plain(weights.w13), plain(weights.w2), aligned, None, up, down)  # [T*K, D]
        return ExpertsOutput(y, offsets[1:] - offsets[:-1])

    def unpermute(self, y_sorted: torch.Tensor, sorted_copy_ids: torch.Tensor, topk_weights: torch.Tensor,
                  shared: torch.Tensor | None) -> torch.Tensor:
        """y_sorted is [T*K, D] in copy order here, so no scatter is needed."""
        T, K = topk_weights.shape
        out = combine(y_sorted.view(T, K, -1), topk_weights)  # [T, D]
        return out if shared is None else out + shared

    def gemm_configs(self, device: torch.device, E: int, N: int, T: int, K: int,
                     fmt: WeightFormat = WeightFormat.NONE) -> tuple[GemmConfig, GemmConfig]:
        """(w13 config, w2 config) for T tokens; both share the w13 config's BLOCK_SIZE_M."""
        up_table = self._table(E, N, device_name(device), fmt, "up")
        if up_table is None:
            cfg = default_config(T, E, K)
            return cfg, cfg
        up = nearest(up_table, T)
        down_table = self._table(E, N, device_name(device), fmt, "down")
        down = nearest(down_table, T).with_block_m(up.block_m) if down_table else up
        return up, down

    def _table(self, E: int, N: int, device: str, fmt: WeightFormat, gemm: str) -> ConfigTable | None:
        key = (E, N, device, int(fmt), gemm)
        if key not in self._tables:
            self._tables[key] = find_table(E, N, device, fmt, gemm, self.config_dir)
        return self._tables[key]
