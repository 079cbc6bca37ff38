"""Many-row matmul of a packed (int8 / int4) weight on CPU: W dequantised a panel of rows at a time.

  W [N, K] packed ── panel of P rows ──► fp32 buffer [P, K] (~PANEL_BYTES, reused) ── torch GEMM ──►
  yT[r:r+P] = panel @ x.T        (yT [N, M]: the output transposed, every panel's rows contiguous)

A prefill multiplies hundreds of rows by each weight, so it is bound by matmul throughput and torch's
GEMM does it; what a packed weight adds is its dequantisation. Dequantising the whole weight per call
(the plain way, `formats.dequantize`) writes and reads back 4 bytes a weight through memory and takes
two full-size temporaries: 1.2-2.0x the time of the same GEMM on a cached fp32 weight (int8 experts of
the Mixtral-style 364M bench model, 128 rows an expert, 2 threads, docs/cpu.md). A panel of ~2 MB is
dequantised into one reused buffer and multiplied while it is still in cache; the GEMM takes the panel as
its left operand (W @ x.T), which torch runs faster here than x @ W.T on the same shapes: 0.85-0.92x
of the cached-fp32 time. The dequantised values are the plain way's bit for bit; the products equal its
within fp32 GEMM rounding (bit-identical on the hosts measured).
With a VNNI dot product int8 weights skip the widening: x is rounded per row into X_PARTS int8 parts
and torch's integer GEMM (`torch._int_mm`, oneDNN's VNNI kernels: ~4.7x its fp32 GEMM's rate here)
multiplies a panel of weight rows by all parts at once (`int8_mm_t`): 1.17x the widened panels on the
364M bench model's prefill, its quality table unchanged to the last digit (2 parts moved it).
Twin: `formats.dequantize` then `x @ W.T` (`packed_linear_ref`).
"""

from __future__ import annotations

import functools
import threading

import torch

from moetune.kernels.cpu import isa
from moetune.kernels.cpu.formats import dequantize, in_features
from moetune.kernels.cpu.runtime import jit, numpy_view
from moetune.kernels.quant_formats import PackedWeight, WeightFormat

PANEL_BYTES = 2 << 20  # fp32 bytes of one dequantised panel (measured best 1.5-3 MB, docs/cpu.md)
PANEL_ALIGN = 16  # panel rows are a multiple of this
X_PARTS = 3  # int8 parts of x on the integer way (`int8_mm_t`): 2 moved the quality table's last digits

_buffers = threading.local()  # one reused panel buffer per thread (engines in threads never share one)


def takes(x: torch.Tensor, w: object) -> bool:
    """Whether `packed_linear` runs this: fp32 CPU rows against an int8 / int4 weight [N, K]."""
    return (isinstance(w, PackedWeight) and w.fmt in (WeightFormat.INT8, WeightFormat.INT4) and w.data.dim() == 2
            and x.dtype == torch.float32 and x.device.type == "cpu" and w.data.device.type == "cpu")


@functools.cache
def vnni_kernels() -> bool:
    """Whether the CPU kernels were compiled with a VNNI dot product (the avx512-vnni or avx-vnni variant)."""
    jit()  # the kernels' variant is chosen with the first compile
    return isa.compiled() in ("avx512-vnni", "avx-vnni")


def int4_kernel_at_prefill() -> bool:
    """Whether int4 weights keep the interleaved integer kernels (`q4r`) at prefill: with a VNNI dot product
    (avx512-vnni measured: 1.38x the panels at a 512-token prefill; avx-vnni assumed alike) they beat
    torch's fp32 GEMM; without (avx2 measured: the panels 1.32x the kernel, 3 `vpmaddubsw` chains for
    x's 3 parts) int4 takes the panels, as int8 does (docs/cpu.md)."""
    return vnni_kernels()


def panel_rows(K: int) -> int:
    """Rows of one panel for a reduction dim of K (at least PANEL_ALIGN)."""
    return max(PANEL_ALIGN, PANEL_BYTES // (4 * K) // PANEL_ALIGN * PANEL_ALIGN)


def _buffer(numel: int) -> torch.Tensor:
    buf = getattr(_buffers, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _buffers.buf = torch.empty(numel)
    return buf


def _dequantize_rows(k, w: PackedWeight, r0: int, out: torch.Tensor) -> torch.Tensor:
    """Rows r0:r0+P of w as fp32 into `out` [P, K] (the plain way's values, bit for bit), one numba pass."""
    kernel = k.dequant_int8_rows if w.fmt == WeightFormat.INT8 else k.dequant_int4_rows
    scale = w.scale if w.scale.dtype == torch.float32 else w.scale.float()  # [N] | [N, G]
    kernel(numpy_view(w.data), numpy_view(scale), r0, out.numpy())
    return out


def int8_integer_at_prefill() -> bool:
    """Whether int8 weights at prefill take torch's integer GEMM (`int8_mm_t`) rather than widened
    panels: where the kernels have a VNNI dot product (avx512-vnni measured, avx-vnni assumed alike) and
    torch has `_int_mm`; without VNNI an int8 GEMM is no faster than fp32's for X_PARTS parts."""
    return vnni_kernels() and hasattr(torch, "_int_mm")


def packed_mm_t(w: PackedWeight, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32 against w [N, K] int8 / int4 → (x @ W.T).T as yT [N, M] (into `out` if given).
    x may be any strided view (a transposed one included). int8 weights take `int8_mm_t` where
    `int8_integer_at_prefill`, else panels widened to fp32."""
    if w.fmt == WeightFormat.INT8 and x.shape[0] > 0 and int8_integer_at_prefill():
        return int8_mm_t(w, x, out)
    N, K = w.data.shape[0], in_features(w)
    yT = torch.empty(N, x.shape[0]) if out is None else out  # [N, M]
    P = panel_rows(K)
    buf = _buffer(min(P, N) * K)
    xT, k = x.t(), jit()  # [K, M]
    for r0 in range(0, N, P):
        r1 = min(N, r0 + P)
        panel = _dequantize_rows(k, w, r0, buf[: (r1 - r0) * K].view(r1 - r0, K))  # [P, K]
        torch.mm(panel, xT, out=yT[r0:r1])  # [P, M]
    return yT


def int8_mm_t(w: PackedWeight, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32 against an int8 w [N, K] → yT [N, M] through torch's integer GEMM: x rounded per row
    into X_PARTS int8 parts (`_jit_panels.x_parts_rows`), each panel of weight rows multiplied by all
    parts at once into int32 [R, X_PARTS·M], the parts summed back in fp32 (`combine_parts`)."""
    N, K = w.data.shape
    M = x.shape[0]
    k = jit()
    xq = torch.empty(X_PARTS * M, K, dtype=torch.int8)  # [P·M, K]
    d = torch.empty(M)  # [M]
    k.x_parts_rows(x.detach().numpy(), xq.numpy(), d.numpy())
    yT = torch.empty(N, M) if out is None else out  # [N, M]
    scale = w.scale if w.scale.dtype == torch.float32 else w.scale.float()  # [N]
    R = min(N, max(PANEL_ALIGN, PANEL_BYTES // (4 * X_PARTS * M) // PANEL_ALIGN * PANEL_ALIGN))
    xqT = xq.t()  # [K, P·M]
    for r0 in range(0, N, R):
        r1 = min(N, r0 + R)
        acc = torch._int_mm(w.data[r0:r1], xqT)  # [R, P·M] int32
        k.combine_parts(acc.numpy(), numpy_view(scale), r0, d.numpy(), yT[r0:r1].numpy())
    return yT


def packed_linear(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize(w).T (+ bias [N]) → y [M, N] contiguous, through `packed_mm_t`."""
    y = packed_mm_t(w, x).t().contiguous()  # [M, N]
    return y if bias is None else y.add_(bias)


def packed_linear_ref(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of `packed_linear`: the whole weight dequantised, then torch's linear."""
    return torch.nn.functional.linear(x, dequantize(w), bias)
