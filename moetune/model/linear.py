"""Projections: y = x @ W.T (+ b), through the CPU decode kernel when only a few rows share W.

A decode step multiplies a few rows by every weight once, so its time is the weight bytes over the
memory bandwidth; torch's small-M sgemm reads W at about half that rate on the CPU, while
`moetune.kernels.cpu.linear` reads W once for up to ~16 rows at the read limit. The loader turns the
kernel on (`small_m`) for fp32 models on the CPU under the `cpu` kernel backend; every other case,
and steps with more rows (prefill), take torch's GEMM (packed weights: below).

A weight is a float tensor or a packed int8 / int4 `PackedWeight` [N, K] (`moetune quantize
--dense`, or a recipe's `quant.dense`: `model/dense_quant.py`). A packed weight runs the kernel up
to LARGE_WEIGHT_M rows whatever its size, and torch's GEMM beyond on panels of the weight
dequantised one at a time (`kernels/cpu/panels.py`); wherever the kernel is off (the torch twin),
`F.linear` on its whole dequantised copy. An int4 weight runs the kernel at every M while
`runtime.Q4_INTERLEAVED` is on and the kernels have a VNNI dot product (`panels.int4_kernel_at_prefill`:
the interleaved kernels beat the panels' GEMM at prefill then, and lose to it without, docs/cpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moetune.kernels.cpu import linear as cpu_linear
from moetune.kernels.cpu import panels, records
from moetune.kernels.cpu import runtime
from moetune.kernels.cpu.formats import dequantize, weight_bytes
from moetune.kernels.quant_formats import PackedWeight, WeightFormat

Weight = torch.Tensor | PackedWeight  # [N, K]: a float tensor, or int8 / int4 packed

SMALL_M = 16  # rows up to which the CPU kernel runs when it is on
LARGE_WEIGHT_M = 64  # ... and up to which it runs on weights of LARGE_WEIGHT_BYTES or more
LARGE_WEIGHT_BYTES = 128 << 20
# Earlier (F.linear time / kernel time, 2 threads): [4096, 768] 1.49-1.59x at 16-64 rows, the
# [32000, 768] LM head 1.64-2.04x, [8192, 256] 1.08-1.42x, when this was 8 MiB (docs/cpu.md). Re-measured
# 2026-12-05 on the 2-vCPU AVX-512/AMX Xeon, torch 2.13, one OpenMP team per runtime, spinning workers:
# torch's GEMM wins at 17-64 rows on every fp32 weight tried, 0.52-0.86x for the kernel ([8192, 256]
# 0.85x at 17 rows, 0.52x at 64; [4096, 768] 0.83-0.62x; [32000, 768] 0.86-0.65x), so fp32 weights
# take the kernel past SMALL_M rows only from 128 MiB (unmeasured here; packed weights as before).


def project(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, small_m: int = 0) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias [N]) → [M, N]: the CPU kernel when 0 < M ≤ small_m, or
    M ≤ LARGE_WEIGHT_M for a packed weight or one of LARGE_WEIGHT_BYTES or more (when the kernel is on)."""
    M, packed = x.shape[0], isinstance(weight, PackedWeight)
    if 0 < M <= small_m or (small_m and M <= LARGE_WEIGHT_M
                            and (packed or weight.numel() * weight.element_size() >= LARGE_WEIGHT_BYTES)) or (
            small_m and M > 0 and packed and weight.fmt == WeightFormat.INT4 and runtime.Q4_INTERLEAVED
            and panels.int4_kernel_at_prefill()):
        y = cpu_linear(x, weight)  # [M, N]
        return y if bias is None else y.add_(bias)
    if packed and small_m and panels.takes(x, weight):  # many rows: torch's GEMM on panels dequantised in cache
        return panels.packed_linear(x, weight, bias)
    if packed:  # the twin: dequantise, then torch's GEMM
        return F.linear(x, dequantize(weight).to(x.dtype), bias)
    return F.linear(x, weight, bias)


def weight_tensors(w: Weight) -> list[torch.Tensor]:
    """The tensors behind a weight (a packed one's data and scales)."""
    if isinstance(w, PackedWeight):
        return [w.data] + ([w.scale] if w.scale is not None else [])
    return [w]


def out_features(w: Weight) -> int:
    return w.data.shape[0] if isinstance(w, PackedWeight) else w.shape[0]


def nbytes(w: Weight) -> int:
    """Bytes one read of the weight streams (a packed one's scales included)."""
    return weight_bytes(w) if isinstance(w, PackedWeight) else w.numel() * w.element_size()


@dataclass
class Linear:
    weight: Weight  # [out, in]
    bias: torch.Tensor | None = None
    small_m: int = 0  # rows up to which the CPU kernel runs (0: always F.linear)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return project(x, self.weight, self.bias, self.small_m)

    def tensors(self) -> list[torch.Tensor]:
        return weight_tensors(self.weight) + ([self.bias] if self.bias is not None else [])

    @property
    def out_features(self) -> int:
        return out_features(self.weight)

    def kernel_record(self) -> records.Projection:
        """This projection as the fused decode layer's kernels take it (fp32 or int8-per-row CPU weights:
        views)."""
        return records.projection(self.weight, self.bias)

    @classmethod
    def fused(cls, parts: list["Linear"], small_m: int = 0) -> "Linear":
        """One projection whose output is the parts' outputs side by side (one read of x, one call).
        Packed parts (one format) are joined row-wise: per-row scales and groups stay each row's."""
        weight = cat_weights([p.weight for p in parts])  # [Σ out, in]
        bias = None
        if any(p.bias is not None for p in parts):
            bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in parts])
        return cls(weight, bias, small_m)


def cat_weights(ws: list[Weight]) -> Weight:
    """Weights [N_i, K] stacked row-wise → [Σ N_i, K]; packed ones must share one format."""
    if not any(isinstance(w, PackedWeight) for w in ws):
        return torch.cat(ws)
    first = ws[0]
    if not all(isinstance(w, PackedWeight) and (w.fmt, w.group_size) == (first.fmt, first.group_size) for w in ws):
        raise ValueError("joined weights must all be packed in one format")
    return PackedWeight(torch.cat([w.data for w in ws]), torch.cat([w.scale for w in ws]), first.fmt, first.group_size)
