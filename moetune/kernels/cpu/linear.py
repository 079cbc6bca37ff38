"""Small-M linear on CPU: y = x @ W.T for a few rows of x sharing one read of W.

  x [M, K] fp32 ── W [N, K] (fp32 | int8 per row | int4 per group, see `formats`) ──► y [M, N] fp32

Decode reads every weight once per step, so the rate is the weight bytes over the memory
bandwidth; torch's small-M sgemm and its int8 weight-only kernel sit well below that on AVX2.
Fast for M ≤ ~16 (x rows are reused from cache); correct for any M. Twin: `linear_ref`.

Int8 weights against up to `runtime.Q8_ROWS` rows take the integer path when `runtime.INT8_ROW` is
on (`_jit_q8`: x quantised to int16 per block of X_BLOCK columns, int32 dot products as `_simd`'s
vector tiles, one fp32 scale per block); int4 weights against up to `runtime.Q4_ROWS` rows take
theirs (x to int16 per group, nibbles unpacked in-register, one fp32 scale per group). Per-block
scales keep tensor-parallel meshes equal to one rank (`x_block_aligned`). Twins: `linear_q8_ref`,
`linear_q4_ref`; both stay within `q8_bound` of `linear_ref`.
With `runtime.Q4_INTERLEAVED` on (the default) int4 weights take the interleaved kernels at every M
instead (`q4r`: x rounded per group to int8 parts, `runtime.Q4_X_PARTS_FEW` / `Q4_X_PARTS`, the scales a
call of M rows reads, `q4r.scale_fp16`; twin `q4r.linear_q4r_ref`).
Which is faster at which M is measured in docs/cpu.md.
"""

from __future__ import annotations

import torch

from moetune.kernels.cpu.formats import as_packed, check_int4_group, dequantize, in_features, weight_bytes
from moetune.kernels.cpu import runtime
from moetune.kernels.cpu.q4r import quantize_x_ref, repacked, scale_fp16, x_parts
from moetune.kernels.cpu.q4r import x_levels as q4r_levels
from moetune.kernels.cpu.runtime import launch, numpy_view, ones
from moetune.kernels.quant_formats import PackedWeight, WeightFormat

BLOCK_N = 8  # weight rows per work item


def _check(x: torch.Tensor, w: PackedWeight) -> None:
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"x must be a 2-D fp32 CPU tensor [M, K]; got {tuple(x.shape)} {x.dtype} on {x.device}")
    if w.data.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K]; got data of shape {tuple(w.data.shape)}")
    if w.fmt not in (WeightFormat.NONE, WeightFormat.INT8, WeightFormat.INT4):
        raise ValueError(f"the CPU linear takes fp32, int8 or int4 weights, not {w.fmt.name}")
    if w.fmt == WeightFormat.NONE and w.data.dtype != torch.float32:
        raise ValueError(f"an unquantised weight must be fp32, got {w.data.dtype}")
    if in_features(w) != x.shape[1]:
        raise ValueError(f"x has K={x.shape[1]} columns but the weight has K={in_features(w)}")
    if w.fmt == WeightFormat.INT4:
        check_int4_group(x.shape[1], w.group_size)


def split_int4_input(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] → (xq [M, 2, G, group/2]: even columns then odd columns; group sums [M, G])."""
    M, K = x.shape
    G = K // group
    xq = torch.stack((x[:, 0::2], x[:, 1::2]), dim=1).reshape(M, 2, G, group // 2).contiguous()
    return xq, x.reshape(M, G, group).sum(-1).contiguous()


def linear(x: torch.Tensor, w: torch.Tensor | PackedWeight, threads: int | None = None) -> torch.Tensor:
    """x [M, K] fp32, w [N, K] (a bare tensor is fp32) → [M, N] fp32. `threads`: numba threads for
    this call (None: numba's current default)."""
    w = as_packed(w)
    _check(x, w)
    M, N = x.shape[0], w.data.shape[0]
    y = torch.empty(M, N, dtype=torch.float32)  # [M, N]
    if M == 0 or N == 0:
        return y.zero_()
    with launch(threads, weight_bytes(w)) as k:
        if w.fmt == WeightFormat.INT4 and runtime.Q4_INTERLEAVED:
            return _linear_q4r(k, x, w)
        if w.fmt == WeightFormat.INT4 and M <= runtime.Q4_ROWS:
            wq = w.data.contiguous().view(N, -1, w.group_size // 2)  # [N, G, group/2]
            k.linear_q4(numpy_view(x), numpy_view(wq), numpy_view(w.scale.float()), y.numpy(), BLOCK_N)
        elif w.fmt == WeightFormat.INT4:
            xq, xs = split_int4_input(x, w.group_size)  # [M, 2, G, group/2], [M, G]
            wq = w.data.contiguous().view(N, -1, w.group_size // 2)  # [N, G, group/2]
            k.linear_int4(numpy_view(xq), numpy_view(xs), numpy_view(wq),
                          numpy_view(w.scale.float()), y.numpy(), BLOCK_N)
        elif w.fmt == WeightFormat.INT8 and runtime.INT8_ROW and M <= max(1, runtime.Q8_ROWS):
            k.linear_q8(numpy_view(x), numpy_view(w.data), numpy_view(w.scale.float()), y.numpy(), BLOCK_N)
        else:
            scale = ones(N) if w.scale is None else w.scale.float()  # [N]
            k.linear_dense(numpy_view(x), numpy_view(w.data), numpy_view(scale), y.numpy(), BLOCK_N)
    return y


def _linear_q4r(k, x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """An int4 weight through the interleaved kernels (`q4r`), rows past N cut off."""
    data, scale = repacked(w)  # [Npad, G, H], [S·Npad/16, G, 16] (`q4r.Scales`)
    N = w.data.shape[0]
    y = torch.empty(x.shape[0], data.shape[0], dtype=torch.float32)  # [M, Npad]
    k.linear_q4r(numpy_view(x), numpy_view(data), numpy_view(scale), y.numpy(), runtime.Q4_X_PARTS_FEW,
                 runtime.Q4_X_PARTS)
    return y if data.shape[0] == N else y[:, :N].contiguous()


def linear_ref(x: torch.Tensor, w: torch.Tensor | PackedWeight, threads: int | None = None) -> torch.Tensor:
    """Twin of `linear`: dequantise, then x @ W.T in fp32 (`threads` is ignored)."""
    w = as_packed(w)
    _check(x, w)
    return x @ dequantize(w).t()  # [M, N]


X_BLOCK = 64  # x columns per scale against int8 weights (`_simd.XB`; int4 weights: their group)


def rounding_rel(block: int, levels: int = 32767) -> float:
    """The integer paths' rounding of x as a relative input error: each element moves by at most
    absmax(its block) / (2·levels), and Σ_b n_b·absmax_b² ≤ block·‖x‖², so the rounded row x̃ has
    ‖x̃ − x‖ ≤ √block / (2·levels) · ‖x‖ (blocks of `block` columns; levels: `x_levels`)."""
    return block ** 0.5 / (2 * levels)


def x_levels(w: PackedWeight, rows: int = 1) -> int:
    """x's rounding on the integer path of w in a call of `rows` x rows: each element moves by at most
    absmax(its block) / (2·levels). 32767 (int16 x), or for int4 on the interleaved kernels
    (`runtime.Q4_INTERLEAVED`) 127·254^(parts − 1) (`q4r.x_levels`: int8 parts of x)."""
    if w.fmt == WeightFormat.INT4 and runtime.Q4_INTERLEAVED:
        return q4r_levels(x_parts(rows))
    return 32767


def scale_rel(w: PackedWeight, rows: int = 1) -> float:
    """How far the scales a call of `rows` x rows reads from w are from its own, relative: 2⁻¹¹ for int4
    on the interleaved kernels in a call that reads the copy's fp16 scales (`q4r.scale_fp16`), else 0."""
    fp16 = w.fmt == WeightFormat.INT4 and runtime.Q4_INTERLEAVED and scale_fp16(rows)
    return 2.0 ** -11 if fp16 else 0.0


def x_block(w: PackedWeight) -> int:
    """Columns of x that share one scale on the integer path of w: its group (int4) or X_BLOCK (int8)."""
    return w.group_size if w.fmt == WeightFormat.INT4 else X_BLOCK


def x_block_aligned(k_slice: int, w: PackedWeight) -> bool:
    """Whether a slice of k_slice input columns (a rank's share of a row-parallel weight) is whole x
    blocks, so that the rank rounds x exactly as one rank holding the whole row does."""
    return w.fmt not in (WeightFormat.INT8, WeightFormat.INT4) or k_slice % x_block(w) == 0


def quantize_rows_ref(x: torch.Tensor, block: int = X_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 → (xq [M, K] int16, xs [M, B] with B = ⌈K / block⌉): the integer path's rounding
    of x (`_jit_q8.quantize_row`: each block of `block` columns, the last maybe short, to ±32767 by
    its own absmax)."""
    M, K = x.shape
    B = -(-K // block)
    pad = torch.nn.functional.pad(x, (0, B * block - K)).view(M, B, block)  # [M, B, block]
    top = pad.abs().amax(dim=2)  # [M, B]
    inv = torch.where(top > 0, 32767 / top, torch.zeros_like(top))
    xq = torch.round(pad * inv[:, :, None]).clamp(-32767, 32767).to(torch.int16).view(M, B * block)[:, :K]
    return xq, top / 32767


def _per_block(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., K] → [..., B, block], zero-padded to whole blocks."""
    B = -(-x.shape[-1] // block)
    return torch.nn.functional.pad(x, (0, B * block - x.shape[-1])).unflatten(-1, (B, block))


def linear_q8_ref(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """Twin of the integer path: x rounded as it rounds it, each block's integer sum exact (int64),
    times its scale, summed in float64, times the row's scale."""
    xq, xs = quantize_rows_ref(x)
    acc = torch.einsum("mbk,nbk->mnb", _per_block(xq.to(torch.int64), X_BLOCK),
                       _per_block(w.data.to(torch.int64), X_BLOCK))  # [M, N, B] exact
    return ((acc.double() * xs.double()[:, None, :]).sum(-1) * w.scale.double()[None, :]).float()


def linear_q4_ref(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """Twin of the int4 integer path: x rounded to int16 per group (its own scale), each group's sum
    exact (int64), times both scales, summed in float64."""
    xq, xs = quantize_rows_ref(x, w.group_size)  # [M, K], [M, G]
    M, K = x.shape
    G = K // w.group_size
    b = w.data.to(torch.int64)  # [N, K/2]
    q = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(-1, G, w.group_size) - 8  # [N, G, group]
    acc = torch.einsum("mgk,ngk->mng", xq.to(torch.int64).reshape(M, G, w.group_size), q)  # [M, N, G] exact
    return (acc.double() * w.scale.double()[None] * xs.double()[:, None, :]).sum(-1).float()


def q8_bound(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """[M, N]: how far an integer path may be from `linear_ref` by rounding x:
    Σ_b (xs_b / 2)·Σ_{k in b} |W[n, k]| (xs_b: absmax of x's block b / `x_levels(w, M)`, `x_block` columns);
    int4 on the interleaved kernels in a call that reads fp16 scales (`q4r.scale_fp16`): + 2⁻¹¹·Σ_k |x[m, k]|·|W[n, k]|."""
    block = x_block(w)
    _, xs = quantize_rows_ref(x, block)  # [M, B]
    levels = x_levels(w, x.shape[0])
    if levels != 32767:  # int4 on the interleaved kernels (int8 parts of x)
        _, xd = quantize_x_ref(x, block)  # [M, G]: absmax / 127
        xs = xd * 127 / levels
        wabs = dequantize(w).abs()  # [N, K]
        fp16 = 2.0 ** -11 * (x.abs() @ wabs.t()) if scale_fp16(x.shape[0]) else 0.0  # ≤ 2⁻¹¹ relative each
        return (xs / 2) @ _per_block(wabs, block).sum(-1).t() + fp16
    wabs = _per_block(dequantize(w).abs(), block).sum(-1)  # [N, B]
    return (xs / 2) @ wabs.t()
