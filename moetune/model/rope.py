"""Rotary position embeddings: plain, linear-scaled and YaRN (the DeepSeek-V3 long-context form)."""

from __future__ import annotations

import math

import torch

from moetune.kernels.cpu.rowwise import rope_
from moetune.spec import RopeSpec


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rope: RopeSpec) -> torch.Tensor:
    """Blend interpolated and extrapolated frequencies with a linear ramp over the correction range."""
    dim, base = rope.dim, rope.theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # [dim/2]

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(rope.original_max_position / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [dim/2]
    extrapolation_weight = 1 - ramp
    return (1.0 / (rope.factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation_weight


def yarn_attention_factor(rope: RopeSpec) -> float:
    """The factor YaRN multiplies into cos/sin (1.0 for other kinds)."""
    if rope.kind != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return float(rope.attention_factor)
    if rope.mscale and rope.mscale_all_dim:
        return _yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(rope.factor, rope.mscale_all_dim)
    return _yarn_mscale(rope.factor)


def softmax_scale_multiplier(rope: RopeSpec) -> float:
    """DeepSeek multiplies the attention softmax scale by mscale(factor, mscale_all_dim)²."""
    if rope.kind == "default" or not rope.mscale_all_dim:
        return 1.0
    m = _yarn_mscale(rope.factor, rope.mscale_all_dim)
    return m * m


class Rotary:
    """cos/sin for given positions; applied to [..., T, rot_dim] tensors (rotate-half convention)."""

    def __init__(self, rope: RopeSpec, device: torch.device, kernel: bool = False):
        """kernel: `apply_` rotates fp32 CPU tensors with the one-call CPU kernel (`kernels/cpu/rowwise.py`)."""
        if rope.kind == "yarn":
            inv_freq = _yarn_inv_freq(rope)
        else:
            inv_freq = 1.0 / (rope.theta ** (torch.arange(0, rope.dim, 2, dtype=torch.float32) / rope.dim))
            if rope.kind == "linear":
                inv_freq = inv_freq / rope.factor
        self.inv_freq = inv_freq.to(device)  # [rot_dim/2]
        self.scale = yarn_attention_factor(rope)
        self.interleave = rope.interleave
        self.kernel = kernel
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # `cos_sin`

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, rot_dim] for positions [T], all below `end` (known on the host: no read-back):
        rows of a table kept per dtype (the values computing them gives, made once: a step then costs
        two gathers, not nine small ops on caches the last weight stream flushed), grown to 2·end."""
        table = self._tables.get(dtype)
        if table is None or table[0].shape[0] < end:
            table = self._tables[dtype] = self._table(max(2 * end, 256), dtype)
        return table[0][positions], table[1][positions]

    def _table(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(n, device=self.inv_freq.device)[:, None].float() * self.inv_freq[None, :]  # [n, rot_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [n, rot_dim]
        return (emb.cos() * self.scale).to(dtype), (emb.sin() * self.scale).to(dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, H, rot_dim]; cos/sin: [T, rot_dim]."""
        if self.interleave:  # (x0, x1), (x2, x3)... → evens then odds, then the rotate-half form
            x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def apply_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`apply`, written into x (a view of a larger buffer is fine) and returned."""
        if self.kernel and not self.interleave and x.dtype == cos.dtype == torch.float32 and x.device.type == "cpu":
            return rope_(x, cos, sin)
        return x.copy_(self.apply(x, cos, sin))
