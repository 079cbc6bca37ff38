"""Phase `experts`: the grouped GEMM w13 → SiLU(gate)·up → w2 over each slot's rows.

The plain-torch twin of the fused Triton kernel: one pair of GEMMs per non-empty slot, rows
taken from the slot's contiguous segment; quantized slots are dequantised first (each slot in
its own format group's format, so layers that mix formats need nothing more).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from moetune.experts.store import ExpertWeights
from moetune.kernels.quant_formats import PackedWeight, WeightFormat, dequantize


DEFAULT_BLOCK_M = 64  # the row block a grouped GEMM kernel would pad to (the twin pads nothing)


class ExpertsOutput(NamedTuple):
    y: torch.Tensor  # [N, D] one output row per input row, same order
    block_m: int  # row block the kernel padded each slot's segment to (the profiler reports the waste)


def run_experts(x: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> ExpertsOutput:
    """x: [N, D] rows grouped by slot; offsets: [P+1] segment starts."""
    y = torch.empty(x.shape[0], weights.hidden_size, dtype=x.dtype, device=x.device)  # [N, D]
    bounds = offsets.tolist()
    I = weights.intermediate_size
    for e in range(len(bounds) - 1):
        start, end = bounds[e], bounds[e + 1]
        if start == end:
            continue
        w13, w2, j = weights.slot_weights(e)  # the slot's format group, its index there
        h = x[start:end] @ slot_matrix(w13, j, x.dtype).t()  # [n_e, 2I]
        h = F.silu(h[:, :I]) * h[:, I:]  # [n_e, I]
        y[start:end] = h @ slot_matrix(w2, j, x.dtype).t()  # [n_e, D]
    return ExpertsOutput(y, DEFAULT_BLOCK_M)


def slot_matrix(w: PackedWeight, slot: int, dtype: torch.dtype) -> torch.Tensor:
    """One slot's weight [N, Kd] in `dtype` (a view when the format is plain)."""
    if w.fmt == WeightFormat.NONE:
        return w.data[slot].to(dtype)
    one = PackedWeight(w.data[slot : slot + 1], w.scale[slot : slot + 1], w.fmt, w.group_size)
    return dequantize(one, dtype)[0]
