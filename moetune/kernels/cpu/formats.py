"""Weight formats of the CPU kernels: quantise and dequantise (pure torch, any leading dims).

A weight is [..., N, K]: N output rows, K the reduction dim ([N, K] for a linear, [E, 2I, D] /
[E, D, I] for the expert weights). The container is `quant_formats.PackedWeight`, so the bytes
are the same ones the Triton kernels read:

| format | data                       | scale                        | value                        |
|--------|----------------------------|------------------------------|------------------------------|
| NONE   | [..., N, K] fp32           | None                         | data                         |
| INT8   | [..., N, K] int8           | [..., N] fp32 per row        | data · scale[n]              |
| INT4   | [..., N, K/2] uint8        | [..., N, K/group] fp32       | (nibble - 8) · scale[n, g]   |

INT8 is symmetric: scale = absmax(row) / 127, data in [-127, 127].
INT4 is symmetric with zero point 8: scale = absmax(group) / 7, q = round(w / scale) clamped to
[-8, 7], stored as q + 8 in [0, 15]; byte j of a row holds k = 2j in its low nibble and
k = 2j + 1 in its high nibble; a group is `group` consecutive k (32, 64 or 128), so K must be a
multiple of the group.
"""

from __future__ import annotations

import torch

from moetune.kernels.quant_formats import PackedWeight, WeightFormat

INT4_GROUPS = (32, 64, 128)


def check_int4_group(k: int, group: int) -> None:
    if group not in INT4_GROUPS or k % group:
        raise ValueError(f"int4 needs a group size in {INT4_GROUPS} that divides K={k}; got group {group}"
                         f" (pad K to a multiple of the group, or use int8)")


def quantize_int8(w: torch.Tensor) -> PackedWeight:
    """[..., N, K] float → INT8 PackedWeight (per-row absmax scale)."""
    w = w.float()
    scale = (w.abs().amax(dim=-1) / 127.0).clamp_min(1e-12)  # [..., N]
    data = (w / scale[..., None]).round().clamp(-127, 127).to(torch.int8)  # [..., N, K]
    return PackedWeight(data.contiguous(), scale.contiguous(), WeightFormat.INT8)


def quantize_int4(w: torch.Tensor, group: int = 64) -> PackedWeight:
    """[..., N, K] float → INT4 PackedWeight (per-group absmax scale, zero point 8)."""
    *lead, K = w.shape
    check_int4_group(K, group)
    groups = w.float().reshape(*lead, K // group, group)  # [..., N, G, group]
    scale = (groups.abs().amax(dim=-1) / 7.0).clamp_min(1e-12)  # [..., N, G]
    q = ((groups / scale[..., None]).round().clamp(-8, 7) + 8).to(torch.uint8)  # [..., N, G, group]
    q = q.reshape(*lead, K // 2, 2)  # [..., N, K/2, 2]
    data = q[..., 0] | (q[..., 1] << 4)  # [..., N, K/2]
    return PackedWeight(data.contiguous(), scale.contiguous(), WeightFormat.INT4, group)


def dequantize_int8(w: PackedWeight) -> torch.Tensor:
    """INT8 PackedWeight → [..., N, K] fp32."""
    return w.data.float() * w.scale[..., None]


def dequantize_int4(w: PackedWeight) -> torch.Tensor:
    """INT4 PackedWeight → [..., N, K] fp32."""
    *lead, half = w.data.shape
    b = w.data.to(torch.int32)  # [..., N, K/2]
    q = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*lead, 2 * half) - 8  # [..., N, K]
    return q.float() * w.scale.repeat_interleave(w.group_size, dim=-1)


def as_packed(w: torch.Tensor | PackedWeight) -> PackedWeight:
    """A bare tensor is an fp32 (NONE) weight."""
    return w if isinstance(w, PackedWeight) else PackedWeight(w, None, WeightFormat.NONE)


def dequantize(w: torch.Tensor | PackedWeight) -> torch.Tensor:
    """Any supported weight → [..., N, K] fp32 (the twins' view of a weight)."""
    w = as_packed(w)
    if w.fmt == WeightFormat.NONE:
        return w.data.float()
    if w.fmt == WeightFormat.INT8:
        return dequantize_int8(w)
    if w.fmt == WeightFormat.INT4:
        return dequantize_int4(w)
    raise ValueError(f"the CPU kernels take fp32, int8 or int4 weights, not {w.fmt.name}")


def weight_bytes(*ws: PackedWeight) -> int:
    """Bytes a kernel reads for these weights (data + scales)."""
    return sum(w.data.nbytes + (w.scale.nbytes if w.scale is not None else 0) for w in ws)


def in_features(w: PackedWeight) -> int:
    """K, the unpacked reduction dim."""
    return w.data.shape[-1] * (2 if w.fmt == WeightFormat.INT4 else 1)
