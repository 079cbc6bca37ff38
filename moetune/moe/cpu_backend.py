"""The `cpu` kernel backend: the MoE phases through the numba CPU kernels (`moetune.kernels.cpu`).

  router GEMM → the small-M linear kernel (torch's sgemm wakes its thread pool for a [T, E]
            output: ~100 µs against ~10 on this VM)
  router top-k, permute, unpermute → one numba call each (`kernels/cpu/routing.py`): the same
            outputs as the torch phases, without their chain of small ops (group-limited routing
            and inputs that are not fp32 take the torch phases)
  experts → slots with at most MAX_ROWS rows (SMALL_EXPERT_ROWS for experts under 1 MiB): one
            `fused_experts_cpu` call, each expert's weights read once for all its rows and no
            Python loop over experts; slots with more rows (prefill) take torch's GEMMs, which run
            near the matmul rate there (int8 / int4 weights dequantised a panel of rows at a time,
            `kernels/cpu/panels.py`). The output is the same [N, D] in the same row order.

Inputs the kernels do not take (not fp32, not on the CPU, FP8 weights) run the torch twin.
`resolve_backend("auto")` picks this backend on the CPU; numba is imported on the first call.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from moetune.experts.store import ExpertWeights, SlotMap
from moetune.kernels.cpu import INT4_GROUPS, fused_experts_cpu, linear, runtime
from moetune.kernels.cpu.experts import experts_record
from moetune.kernels.cpu.records import Experts
from moetune.kernels.cpu.routing import permute_rows, select_topk, takes_routing, unpermute_rows
from moetune.kernels.cpu.arrays import fp32_cpu
from moetune.kernels.cpu.panels import int4_kernel_at_prefill, packed_mm_t
from moetune.kernels.quant_formats import PackedWeight, WeightFormat
from moetune.moe.torch_backend import TorchBackend
from moetune.moe.experts import ExpertsOutput, run_experts, slot_matrix
from moetune.moe.permute import PermuteOutput

MAX_ROWS = 16  # rows of one slot up to which the kernel beats torch's GEMM (each row reuses the weight read)
SMALL_EXPERT_BYTES = 1 << 20  # w13 + w2 of one expert below this: torch's per-slot calls cost more than the math
INT4_ROWS = 1 << 30  # int4 experts with the interleaved kernels (`runtime.Q4_INTERLEAVED`): every row count
# (a 512-token prefill's int4 experts: the kernel 4-9x the old path per projection, at or above
# torch's fp32 GEMM on the dequantised copy, docs/cpu.md) — where the kernels have VNNI
# (`panels.int4_kernel_at_prefill`: without it the panels win, and `row_limit` takes the rule below)
SMALL_EXPERT_ROWS = 64  # so such experts stay on the kernel up to this many rows (bundled model: +15 % tok/s)
ROUTER_ROWS = 64  # tokens up to which the router GEMM runs the small-M kernel (decode-shaped steps)
KERNEL_FORMATS = (WeightFormat.NONE, WeightFormat.INT8, WeightFormat.INT4)


class CPUBackend(TorchBackend):
    name = "cpu"

    def __init__(self, max_rows: int | None = None):
        self.max_rows = max_rows  # None: MAX_ROWS, or SMALL_EXPERT_ROWS for small experts (`row_limit`)

    def row_limit(self, weights: ExpertWeights) -> int:
        """Rows of one slot up to which the kernel computes it: beyond, torch's GEMM is faster, by
        an amount that only pays for its per-slot calls (3 GEMM-sized ops each) when the expert is big."""
        if self.max_rows is not None:
            return self.max_rows
        if weights.w13.fmt == WeightFormat.INT4 and runtime.Q4_INTERLEAVED and int4_kernel_at_prefill():
            return INT4_ROWS
        w13, w2 = weights.w13.data, weights.w2.data
        per_expert = (w13.numel() * w13.element_size() + w2.numel() * w2.element_size()) // w13.shape[0]
        return SMALL_EXPERT_ROWS if per_expert < SMALL_EXPERT_BYTES else MAX_ROWS

    def kernel_experts(self, weights: ExpertWeights) -> Experts | None:
        """These weights as the fused decode layer's experts kernel takes them, with this backend's
        `row_limit`; None for what it does not take (several formats, not fp32 / int8 / int4 on the CPU)."""
        w13 = weights.w13
        if weights.mixed or w13.data.device.type != "cpu" or not weights_fit(weights):
            return None
        return experts_record(w13, weights.w2, self.row_limit(weights))

    def router_logits(self, x, gate_weight):
        if not fp32_cpu(x, gate_weight) or x.shape[0] > ROUTER_ROWS:  # prefill: torch's parallel GEMM
            return super().router_logits(x, gate_weight)
        return linear(x, gate_weight)  # [T, E]

    def select_experts(self, logits, spec, bias):
        if not fp32_cpu(logits) or not takes_routing(spec):
            return super().select_experts(logits, spec, bias)
        return select_topk(logits, spec, bias)

    def permute(self, x, slot_ids, num_slots):
        if not fp32_cpu(x):
            return super().permute(x, slot_ids, num_slots)
        return PermuteOutput(*permute_rows(x, slot_ids, num_slots))

    def unpermute(self, y_sorted, sorted_copy_ids, topk_weights, shared):
        if not fp32_cpu(y_sorted):
            return super().unpermute(y_sorted, sorted_copy_ids, topk_weights, shared)
        return unpermute_rows(y_sorted, sorted_copy_ids, topk_weights, shared)

    def experts(self, x: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> ExpertsOutput:
        """x [N, D] rows grouped by slot → y [N, D] in the same order (block_m 1: nothing padded)."""
        if weights.mixed:
            return ExpertsOutput(self._per_group(x, offsets, weights), 1)
        if not kernel_takes(x, weights):
            return run_experts(x, offsets, weights)
        counts = np.diff(offsets.to(torch.int64).numpy())  # [P] (numpy: a few elements, see _segments)
        big = counts > self.row_limit(weights)  # [P]
        if not big.any():
            return ExpertsOutput(fused_experts_cpu(x, offsets, weights.w13, weights.w2), 1)
        small = torch.from_numpy(np.flatnonzero((counts > 0) & ~big))  # [A]
        bounds, I = offsets.tolist(), weights.intermediate_size
        N = x.shape[0]
        # every row is some slot's when the slots cover [0, N): no zero fill (12.6 MB at 512 tokens, K = 8)
        y = torch.empty(N, x.shape[1]) if bounds[0] == 0 and bounds[-1] == N else None  # [N, D]
        y = fused_experts_cpu(x, offsets, weights.w13, weights.w2, experts=small, out=y)  # big slots' rows next
        for e in np.flatnonzero(big).tolist():
            rows = slice(bounds[e], bounds[e + 1])
            if weights.w13.fmt == WeightFormat.NONE:
                h = x[rows] @ slot_matrix(weights.w13, e, x.dtype).t()  # [n_e, 2I]
                torch.mm(F.silu(h[:, :I]) * h[:, I:], slot_matrix(weights.w2, e, x.dtype).t(), out=y[rows])  # [n_e, D]
            else:
                y[rows] = packed_slot_experts(x[rows], slot_weight(weights.w13, e), slot_weight(weights.w2, e), I)
        return ExpertsOutput(y, 1)

    def _per_group(self, x: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> torch.Tensor:
        """A layer in several formats: each format group's rows are one contiguous slice (the
        ExpertWeights contract), run through this backend as a one-format layer."""
        y = torch.zeros(x.shape[0], weights.hidden_size, dtype=x.dtype, device=x.device)  # [N, D]
        bounds = offsets.tolist()
        for g in weights.groups:
            lo, hi = bounds[g.start], bounds[g.stop]
            if lo == hi:
                continue
            one = ExpertWeights(g.w13, g.w2, SlotMap(g.size))
            y[lo:hi] = self.experts(x[lo:hi], offsets[g.start : g.stop + 1] - offsets[g.start], one).y
        return y

    def warm(self, weights: ExpertWeights) -> None:
        """Compile the kernel for these weights' format (or load it from numba's disk cache) now, so
        that the first request does not wait for it: one row through slot 0."""
        x = torch.zeros(1, weights.hidden_size, dtype=torch.float32)  # [1, D]
        for g in weights.groups:
            one = ExpertWeights(g.w13, g.w2, SlotMap(g.size))
            if kernel_takes(x, one):
                offsets = torch.ones(g.size + 1, dtype=torch.long)
                offsets[0] = 0  # [size+1]: the row belongs to the group's first slot
                self.experts(x, offsets, one)


def slot_weight(w: PackedWeight, slot: int) -> PackedWeight:
    """One slot of a packed [P, N, K] weight as a [N, K] one (views)."""
    return PackedWeight(w.data[slot], w.scale[slot], w.fmt, w.group_size)


def packed_slot_experts(x: torch.Tensor, w13: PackedWeight, w2: PackedWeight, I: int) -> torch.Tensor:
    """One int8 / int4 expert over many rows (prefill), panels dequantised as torch's GEMM takes them
    (`kernels/cpu/panels.py`, the outputs transposed throughout): x [n, D] → y [n, D] (a transposed view)."""
    hT = packed_mm_t(w13, x)  # [2I, n]
    aT = F.silu(hT[:I]).mul_(hT[I:])  # [I, n]
    return packed_mm_t(w2, aT.t()).t()  # [n, D]


def kernel_takes(x: torch.Tensor, weights: ExpertWeights) -> bool:
    """Whether `fused_experts_cpu` computes these inputs (else the torch twin does)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and weights_fit(weights)


def weights_fit(weights: ExpertWeights) -> bool:
    """Whether `fused_experts_cpu` takes these weights (one layer in one format)."""
    w13, w2 = weights.w13, weights.w2
    return (w13.fmt == w2.fmt and w13.fmt in KERNEL_FORMATS
            and (w13.fmt != WeightFormat.NONE or w13.data.dtype == w2.data.dtype == torch.float32)
            and (w13.fmt != WeightFormat.INT4 or _int4_fits(weights)))


def _int4_fits(weights: ExpertWeights) -> bool:
    g13, g2 = weights.w13.group_size, weights.w2.group_size
    return (g13 in INT4_GROUPS and g2 in INT4_GROUPS and weights.hidden_size % g13 == 0
            and weights.intermediate_size % g2 == 0)
