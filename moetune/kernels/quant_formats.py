"""Weight-only formats of the expert GEMMs: quantise, pack, dequantise (the reference formats).

A weight is [E, N, Kd] (N output rows, Kd the reduction dim: w13 is [E, 2I, D], w2 is [E, D, I]).

| format | data                         | scale                     | value                        |
|--------|------------------------------|---------------------------|------------------------------|
| NONE   | [E, N, Kd] bf16/fp16/fp32    | None                      | data                         |
| INT8   | [E, N, Kd] int8              | [E, N] fp32 per channel   | data * scale[n]              |
| FP8    | [E, N, Kd] float8_e4m3fn     | [E, N] fp32 per channel   | data * scale[n]              |
| INT4   | [E, N, Kd/2] uint8, 2 per B  | [E, N, Kd/group] fp32     | (nibble - 8) * scale[n, g]   |

INT4 packs k = 2j in the low nibble and k = 2j + 1 in the high nibble of byte j; symmetric with
zero point 8, groups of `group_size` (64 or 128) consecutive k.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class WeightFormat(enum.IntEnum):
    """The kernel's `FORMAT: tl.constexpr` (values are part of the kernel ABI)."""

    NONE = 0
    INT8 = 1
    INT4 = 2
    FP8 = 3


INT4_GROUP_SIZES = (64, 128)
_FP8_MAX = 448.0


@dataclass(frozen=True)
class PackedWeight:
    data: torch.Tensor  # see the table above
    scale: torch.Tensor | None
    fmt: WeightFormat = WeightFormat.NONE
    group_size: int = 0  # INT4 only
    stable: bool = True  # False: its tensors are rewritten in place untracked (an offloading step's transient
    # buffer), so no kernel caches anything derived from them (`kernels/cpu/q4r.repacked`)
    generation: torch.Tensor | None = None  # [P] int64: how often each slice of the leading axis was written
    # in place (an offloading cache's slots: `experts/offload.py` counts its writes, which torch's version
    # counter misses); a kernel's cache of derived data keys on it, slice by slice

    @property
    def num_experts(self) -> int:
        return self.data.shape[0]

    @property
    def out_features(self) -> int:  # N
        return self.data.shape[1]

    @property
    def in_features(self) -> int:  # Kd (unpacked)
        return self.data.shape[2] * (2 if self.fmt == WeightFormat.INT4 else 1)


def plain(w: torch.Tensor) -> PackedWeight:
    return PackedWeight(w, None, WeightFormat.NONE)


def quantize(w: torch.Tensor, fmt: WeightFormat, group_size: int = 128) -> PackedWeight:
    """w: [E, N, Kd] float → PackedWeight in `fmt` (scales from the per-channel / per-group absmax)."""
    if fmt == WeightFormat.NONE:
        return plain(w)
    w = w.float()
    if fmt == WeightFormat.INT4:
        return _quantize_int4(w, group_size)
    qmax = 127.0 if fmt == WeightFormat.INT8 else _FP8_MAX
    scale = (w.abs().amax(dim=-1) / qmax).clamp_min(1e-12)  # [E, N]
    scaled = w / scale[:, :, None]  # [E, N, Kd]
    if fmt == WeightFormat.INT8:
        data = scaled.round().clamp(-127, 127).to(torch.int8)
    else:
        data = scaled.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return PackedWeight(data, scale, fmt)


def _quantize_int4(w: torch.Tensor, group_size: int) -> PackedWeight:
    E, N, Kd = w.shape
    if group_size not in INT4_GROUP_SIZES or Kd % group_size:
        raise ValueError(f"int4 needs group_size in {INT4_GROUP_SIZES} dividing Kd={Kd}, got {group_size}")
    groups = w.view(E, N, Kd // group_size, group_size)  # [E, N, G, group]
    scale = (groups.abs().amax(dim=-1) / 7.0).clamp_min(1e-12)  # [E, N, G]
    q = (groups / scale[..., None]).round().clamp(-8, 7).to(torch.int32) + 8  # [E, N, G, group] in [0, 15]
    q = q.view(E, N, Kd // 2, 2)  # [E, N, Kd/2, 2]
    data = (q[..., 0] | (q[..., 1] << 4)).to(torch.uint8)  # [E, N, Kd/2]
    return PackedWeight(data, scale, WeightFormat.INT4, group_size)


def dequantize(w: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """PackedWeight → [E, N, Kd] in `dtype` (computed in fp32)."""
    if w.fmt == WeightFormat.NONE:
        return w.data.to(dtype)
    if w.fmt == WeightFormat.INT4:
        E, N, half = w.data.shape
        b = w.data.to(torch.int32)  # [E, N, Kd/2]
        q = torch.stack((b & 0xF, b >> 4), dim=-1).view(E, N, 2 * half) - 8  # [E, N, Kd]
        scale = w.scale.repeat_interleave(w.group_size, dim=-1)  # [E, N, Kd]
        return (q.float() * scale).to(dtype)
    return (w.data.float() * w.scale[:, :, None]).to(dtype)
