"""The MoE `experts` phase on CPU: one grouped pass over rows already sorted by expert.

  x [N, D] rows of expert e = x[offsets[e]:offsets[e+1]]
    ── w13[e] [2I, D] ──► gate, up [n_e, I] ── silu(gate)·up ──► a [n_e, I] ── w2[e] [D, I] ──► y [N, D]

Each expert's weights are read once per call for all its rows. When the active experts split
evenly over the threads (two experts on two threads at top-2 decode), or there are at least four
per thread, each thread computes whole experts, w13 then w2, dealt most rows first to the least
loaded thread: no barrier between the two passes stops the weight stream (decode steps 2-12 %
faster here than with the split below). Otherwise the work is split into (expert, block of output
columns) items, so a decode step with fewer active experts than threads still keeps every core
reading. The gate and up rows of one block are computed together, so the activation is written
directly (no [N, 2I] buffer). Weights: fp32, int8 or int4 (`formats`), the same format for w13 and
w2. Fast while rows per expert are few (decode); for long prefills the engine should keep torch's
big GEMMs. Rows outside every segment come back as 0, and so do the rows of experts left out of
`experts` (the engine computes those with torch GEMMs).
Twin: `fused_experts_cpu_ref` (the per-expert torch loop).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from moetune.kernels.cpu.formats import as_packed, check_int4_group, dequantize, in_features, weight_bytes
from moetune.kernels.cpu.linear import split_int4_input
from moetune.kernels.cpu import runtime
from moetune.kernels.cpu.q4r import repacked
from moetune.kernels.cpu.records import Experts, Tuning
from moetune.kernels.cpu.runtime import SERIAL_BYTES, current_threads, jit, launch, numpy_view, ones
from moetune.kernels.quant_formats import PackedWeight, WeightFormat

BLOCK_13 = 16  # gate/up row pairs per work item
BLOCK_2 = 8  # w2 rows per work item
SCHEDULES = {"auto": 0, "split": 1, "whole": 2}  # fp32/int8 work split (see the module docstring)
SCHEDULE = "auto"  # tests force the other two


def experts_record(w13: PackedWeight, w2: PackedWeight, row_limit: int) -> Experts:
    """One layer's experts (w13 [P, 2I, D], w2 [P, D, I], one fp32, int8 or int4 format) as the fused
    decode layer takes them (`records.Experts`): views of the weights, their row scales (ones for
    fp32); int4 weights viewed [P, N, G, group/2] with their group scales, as `experts_int4` takes them."""
    if w13.fmt == WeightFormat.INT4 and runtime.Q4_INTERLEAVED:  # interleaved (`q4r`): [P, 2I, Gd, Hd], [P, S·2I/16, Gd, 16]
        (d13, s13), (d2, s2) = repacked(w13), repacked(w2)
        return Experts(numpy_view(d13), numpy_view(s13), numpy_view(d2), numpy_view(s2), weight_bytes(w13, w2), w13.data.shape[0],
                       int(row_limit))
    if w13.fmt == WeightFormat.INT4:
        (P, two_i), D = w13.data.shape[:2], w2.data.shape[1]
        w13q = w13.data.contiguous().view(P, two_i, -1, w13.group_size // 2)  # [P, 2I, Gd, Hd]
        w2q = w2.data.contiguous().view(P, D, -1, w2.group_size // 2)  # [P, D, Gi, Hi]
        return Experts(numpy_view(w13q), numpy_view(w13.scale.float()), numpy_view(w2q),
                       numpy_view(w2.scale.float()), weight_bytes(w13, w2), P, int(row_limit))
    P, two_i, D = w13.data.shape
    s13 = ones(P, two_i) if w13.scale is None else w13.scale.float().contiguous()  # [P, 2I]
    s2 = ones(P, D) if w2.scale is None else w2.scale.float().contiguous()  # [P, D]
    return Experts(numpy_view(w13.data), s13.numpy(), numpy_view(w2.data), s2.numpy(), weight_bytes(w13, w2), P,
                   int(row_limit))


def tuning(threads: int) -> Tuning:
    """How a fused decode step's kernels run on `threads` threads (`records.Tuning`): the serial rule of
    `runtime.launch`, this module's work items and schedule, the integer paths' row limits (read now:
    tests and A/Bs set SCHEDULE, INT8_ROW, Q8_ROWS and Q4_ROWS)."""
    return Tuning(int(threads), SERIAL_BYTES, BLOCK_13, BLOCK_2, SCHEDULES[SCHEDULE],
                  max(1, runtime.Q8_ROWS) if runtime.INT8_ROW else 0, int(runtime.Q4_ROWS),
                  int(runtime.Q4_X_PARTS_FEW), int(runtime.Q4_X_PARTS))


def _check(x: torch.Tensor, offsets: torch.Tensor, w13: PackedWeight, w2: PackedWeight) -> None:
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"x_sorted must be a 2-D fp32 CPU tensor [N, D]; got {tuple(x.shape)} {x.dtype}")
    if w13.fmt != w2.fmt or w13.fmt not in (WeightFormat.NONE, WeightFormat.INT8, WeightFormat.INT4):
        raise ValueError(f"w13 and w2 must share one format of fp32/int8/int4; got {w13.fmt.name}, {w2.fmt.name}")
    if w13.data.dim() != 3 or w2.data.dim() != 3:
        raise ValueError("w13 must be [E, 2I, D] and w2 [E, D, I]")
    E, D, I = w13.data.shape[0], x.shape[1], in_features(w2)
    if tuple(w13.data.shape[:2]) != (E, 2 * I) or in_features(w13) != D or tuple(w2.data.shape[:2]) != (E, D):
        raise ValueError(f"w13 must be [E, 2I, D] and w2 [E, D, I] with D={D}; got w13 data "
                         f"{tuple(w13.data.shape)}, w2 data {tuple(w2.data.shape)} ({w13.fmt.name})")
    if offsets.dim() != 1 or offsets.numel() != E + 1:
        raise ValueError(f"offsets must be [E+1] = [{E + 1}], got {tuple(offsets.shape)}")
    if w13.fmt == WeightFormat.INT4:
        check_int4_group(D, w13.group_size)
        check_int4_group(I, w2.group_size)


def _segments(offsets: torch.Tensor, n_rows: int, experts: torch.Tensor | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """(offsets as int64, ids of the non-empty experts, or of `experts` when given), after checking
    the segments fit x. One numba call, not a chain of numpy/torch ops: a decode step calls this right
    after a kernel has flushed the caches, where each op costs µs to tens of µs (docs/cpu.md)."""
    off = numpy_view(offsets.to(torch.int64))  # [E+1]
    if experts is None:
        active = jit().active_experts(off, n_rows)  # [A]
        if active.size == 1 and active[0] < 0:
            raise ValueError(f"offsets must be non-decreasing within [0, {n_rows}], got {off.tolist()}")
        return off, active
    if not jit().offsets_fit(off, n_rows):
        raise ValueError(f"offsets must be non-decreasing within [0, {n_rows}], got {off.tolist()}")
    active = numpy_view(experts.to(torch.int64).flatten())  # [A]
    if active.size and (active.min() < 0 or active.max() >= off.size - 1):
        raise ValueError(f"experts must be ids in [0, {off.size - 1}), got {active.tolist()}")
    return off, active


def fused_experts_cpu(x_sorted: torch.Tensor, offsets: torch.Tensor, w13: torch.Tensor | PackedWeight,
                      w2: torch.Tensor | PackedWeight, threads: int | None = None,
                      experts: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x_sorted [N, D] fp32, offsets [E+1], w13 [E, 2I, D], w2 [E, D, I] → y [N, D] fp32.
    `experts`: ids of the experts to compute (None: every non-empty one); other rows are 0, or,
    with `out` (a C-contiguous fp32 [N, D] to write y into), left as they were."""
    w13, w2 = as_packed(w13), as_packed(w2)
    _check(x_sorted, offsets, w13, w2)
    N, D = x_sorted.shape
    off, active = _segments(offsets, N, experts)
    if out is None:
        y = torch.zeros(N, D, dtype=torch.float32)  # [N, D]
    elif out.shape != (N, D) or out.dtype != torch.float32 or not out.is_contiguous() or out.device.type != "cpu":
        raise ValueError(f"out must be a contiguous fp32 CPU [{N}, {D}], got {tuple(out.shape)} {out.dtype}")
    else:
        y = out
    if active.size == 0 or D == 0 or in_features(w2) == 0:
        return y
    with launch(threads, weight_bytes(w13, w2) * active.size // w13.data.shape[0]) as k:
        run = _run_int4 if w13.fmt == WeightFormat.INT4 else _run_dense
        run(k, x_sorted, off, active, w13, w2, y)
    return y


def _run_dense(k, x, off, active, w13: PackedWeight, w2: PackedWeight, y: torch.Tensor) -> None:
    (E, D), I = w2.data.shape[:2], w2.data.shape[2]
    s13 = ones(E, 2 * I) if w13.scale is None else w13.scale.float()  # [E, 2I]
    s2 = ones(E, D) if w2.scale is None else w2.scale.float()  # [E, D]
    a = torch.empty(x.shape[0], I)  # [N, I] activation scratch
    k.experts_dense(numpy_view(x), off, active, numpy_view(w13.data), numpy_view(s13),
                    numpy_view(w2.data), numpy_view(s2), a.numpy(), y.numpy(), BLOCK_13, BLOCK_2,
                    SCHEDULES[SCHEDULE], 1 if k.SERIAL else current_threads(), int(runtime.INT8_ROW))


def _run_int4(k, x, off, active, w13: PackedWeight, w2: PackedWeight, y: torch.Tensor) -> None:
    if runtime.Q4_INTERLEAVED:  # the interleaved layout against int8 x (`q4r`)
        (d13, s13), (d2, s2) = repacked(w13), repacked(w2)  # [E, 2I, Gd, Hd] [E, S·2I/16, Gd, 16] (`q4r.Scales`), ...
        a = torch.empty(x.shape[0], in_features(w2))  # [N, I] activation scratch
        k.experts_q4r(numpy_view(x), off, active, numpy_view(d13), numpy_view(s13), numpy_view(d2),
                      numpy_view(s2), a.numpy(), y.numpy(), runtime.Q4_X_PARTS_FEW,
                      runtime.Q4_X_PARTS, 1 if k.SERIAL else current_threads())
        return
    (E, D), I = w2.data.shape[:2], in_features(w2)
    N, Gi, Hi = x.shape[0], I // w2.group_size, w2.group_size // 2
    xq, xs = split_int4_input(x, w13.group_size)  # [N, 2, Gd, Hd], [N, Gd]
    aq = torch.empty(N, 2, Gi, Hi)  # activation, even / odd columns
    asum = torch.empty(N, Gi)  # [N, I/group]
    w13q = w13.data.contiguous().view(E, 2 * I, -1, w13.group_size // 2)  # [E, 2I, Gd, Hd]
    w2q = w2.data.contiguous().view(E, D, Gi, Hi)  # [E, D, Gi, Hi]
    k.experts_int4(numpy_view(xq), numpy_view(xs), off, active,
                   numpy_view(w13q), numpy_view(w13.scale.float()), numpy_view(w2q),
                   numpy_view(w2.scale.float()), aq.numpy(), asum.numpy(), y.numpy(),
                   BLOCK_13, BLOCK_2, runtime.Q4_ROWS)


def fused_experts_cpu_ref(x_sorted: torch.Tensor, offsets: torch.Tensor, w13: torch.Tensor | PackedWeight,
                          w2: torch.Tensor | PackedWeight, threads: int | None = None,
                          experts: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of `fused_experts_cpu`: dequantise, then the per-expert torch loop of `run_experts`."""
    w13, w2 = as_packed(w13), as_packed(w2)
    _check(x_sorted, offsets, w13, w2)
    off, active = _segments(offsets, x_sorted.shape[0], experts)
    w13f, w2f = dequantize(w13), dequantize(w2)  # [E, 2I, D], [E, D, I]
    I = w2f.shape[2]
    y = torch.zeros(x_sorted.shape[0], x_sorted.shape[1])  # [N, D]
    for e in active.tolist():
        start, end = int(off[e]), int(off[e + 1])
        h = x_sorted[start:end] @ w13f[e].t()  # [n_e, 2I]
        y[start:end] = (F.silu(h[:, :I]) * h[:, I:]) @ w2f[e].t()  # [n_e, D]
    return y
