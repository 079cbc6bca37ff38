"""Phase `experts`: the grouped GEMM w13 → SiLU(gate)·up → w2 over each expert's rows.

The plain-torch twin of the fused Triton kernel: one pair of GEMMs per non-empty expert, rows
taken from the expert's contiguous segment.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from moetune.experts.store import ExpertWeights


class ExpertsOutput(NamedTuple):
    y: torch.Tensor  # [N, D] one output row per input row, same order (triton: [T*K, D] in copy order t*K+k)
    rows_per_expert: torch.Tensor  # [E] GEMM m-shapes


def run_experts(x: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> ExpertsOutput:
    """x: [N, D] rows grouped by expert; offsets: [E+1] segment starts."""
    y = torch.empty(x.shape[0], weights.w2.shape[1], dtype=x.dtype, device=x.device)  # [N, D]
    bounds = offsets.tolist()
    intermediate = weights.w2.shape[2]
    for e in range(len(bounds) - 1):
        start, end = bounds[e], bounds[e + 1]
        if start == end:
            continue
        h = x[start:end] @ weights.w13[e].t()  # [n_e, 2I]
        h = F.silu(h[:, :intermediate]) * h[:, intermediate:]  # [n_e, I]
        y[start:end] = h @ weights.w2[e].t()  # [n_e, D]
    return ExpertsOutput(y, offsets[1:] - offsets[:-1])
