"""Int4 weights repacked for the CPU's integer kernels: 16 rows interleaved (pure torch; the kernels
are `_jit_q4r` / `_simd_q4r`).

The checkpoint keeps `formats.quantize_int4`'s layout ([..., N, K/2] bytes, scales [..., N, G]); the
CPU repacks each int4 weight once, when a layer's kernel record is made at model load, or on the first
`linear` / `fused_experts_cpu` call that takes it (`repacked`: cached per weight, dropped with it).
The repacked copy is the one the decode kernels read (same bytes per token); the original stays for
the twins, the GPU path and saving.

  data   [..., Npad, G, H] uint8   Npad = N rounded up to 16 (rows past N: zero bytes, scale 0);
                                   bytes of the block of rows 16b..16b+15, group g, in chunks of 4 bytes:
                                   chunk c of row 0, of row 1, ... of row 15, then chunk c + 1
  scale  [..., S·Npad/16, G, 16]  the block's 16 rows' group-g scales side by side (`Scales`, from the
                                   runtime switches): FP16, S = 1: rounded to fp16, their bits as int16
                                   (2 bytes per 32 weights at g32 as llama.cpp's Q4_0; ≤ 2⁻¹¹ of each
                                   scale, groups with absmax < 4.3e-4 subnormal, coarser; < ~2e-7 zero);
                                   FP32, S = 1: fp32; BOTH, S = 3, int16: the fp16 bits of the Npad/16
                                   blocks, then their fp32 scales as int16 pairs ([Npad/16, G, 32]) — calls
                                   of ≤ FEW_ROWS x rows (decode) read the first, longer calls the second

x is rounded per group in int8 parts (`quantize_x_ref`, `x_parts`). By default 2 parts with the fp16
scales in calls of up to 16 rows and 3 parts with the fp32 scales beyond, which keeps the int4 rows of
docs/cpu.md's quality table to the last digit while decode streams Q4_0's bytes; llama.cpp's numerics
(1 part, fp16 scales) move them in their last digits; the exact mode (2 / 3 parts, fp32 scales) keeps them.
Twin: `linear_q4r_ref` (the same rounding, the scales a call of its rows reads, exact int64 sums).
"""

from __future__ import annotations

import enum
import weakref

import torch

from moetune.kernels.cpu import runtime
from moetune.kernels.quant_formats import PackedWeight, WeightFormat

ROWS = 16  # `_simd_q4r.ROWS`
CHUNK = 4  # bytes of one row per int32 lane
PART = 254.0  # one x part's step ÷ the next's (`_simd_q4r.PART`)
FEW_ROWS = 16  # `_jit_q4r.FEW_ROWS`
_CACHE: dict[int, tuple[torch.Tensor, torch.Tensor, tuple]] = {}


class Scales(enum.Enum):
    """The scales a repacked copy holds (module docstring: `scale`)."""
    FP16 = "fp16"  # every call reads fp16 (llama.cpp's Q4_0)
    FP32 = "fp32"  # every call reads fp32 (the checkpoint's values)
    BOTH = "both"  # calls of ≤ FEW_ROWS x rows read fp16, longer ones fp32 (the default)


def scales() -> Scales:
    """The scales the runtime switches ask for (`runtime.Q4_SCALE_FP16_FEW`, `Q4_SCALE_FP16`)."""
    few, many = runtime.Q4_SCALE_FP16_FEW, runtime.Q4_SCALE_FP16
    if few == many:
        return Scales.FP16 if few else Scales.FP32
    if not few:
        raise ValueError("int4: fp32 scales in calls of ≤ 16 rows and fp16 beyond is not a mode the kernels have "
                         "(runtime.Q4_SCALE_FP16_FEW False, Q4_SCALE_FP16 True)")
    return Scales.BOTH


def scale_fp16(rows: int) -> bool:
    """Whether a call (an expert) of `rows` x rows reads fp16 scales (`_jit_q4r.call_rows`)."""
    return runtime.Q4_SCALE_FP16_FEW if rows <= FEW_ROWS else runtime.Q4_SCALE_FP16


def _block_scales(s: torch.Tensor, kind: Scales) -> torch.Tensor:
    """[..., NB, G, 16] fp32 → the copy's scales (module docstring): fp32, fp16 bits, or both (int16)."""
    half = s.half().contiguous().view(torch.int16)  # [..., NB, G, 16]
    if kind == Scales.FP16:
        return half
    if kind == Scales.FP32:
        return s.contiguous()
    *lead, NB, G, _ = s.shape
    wide = s.contiguous().view(torch.int16).reshape(*lead, 2 * NB, G, 16)  # fp32 bits as int16 pairs
    return torch.cat((half, wide), dim=-3)  # [..., 3·NB, G, 16]


def repack(w: PackedWeight, kind: Scales = Scales.FP32) -> tuple[torch.Tensor, torch.Tensor]:
    """An INT4 weight [..., N, K/2] → (data [..., Npad, G, H] uint8, scale [..., S·Npad/16, G, 16]: fp32,
    fp16 bits as int16, or both as int16 (`kind`; module docstring))."""
    if w.fmt != WeightFormat.INT4:
        raise ValueError(f"only int4 weights are repacked, not {w.fmt.name}")
    *lead, N, half = w.data.shape
    H = w.group_size // 2
    G = half // H
    NB = -(-N // ROWS)
    pad = NB * ROWS - N
    data = torch.nn.functional.pad(w.data, (0, 0, 0, pad))  # [..., Npad, K/2]
    scale = torch.nn.functional.pad(w.scale.float(), (0, 0, 0, pad))  # [..., Npad, G]
    d = data.reshape(*lead, NB, ROWS, G, H // CHUNK, CHUNK)
    n = len(lead)
    d = d.permute(*range(n), n, n + 2, n + 3, n + 1, n + 4)  # [..., NB, G, C, 16, 4]
    s = scale.reshape(*lead, NB, ROWS, G).transpose(-1, -2)  # [..., NB, G, 16]
    return d.reshape(*lead, NB * ROWS, G, H).contiguous(), _block_scales(s, kind)


def repacked(w: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """`repack(w)`, made once per weight: cached on its data tensor's identity (dropped when that is
    freed) and remade when its data or scales were written in place since: torch's version counter, or
    for an offloading cache's slots (which it writes without bumping that) their write counts
    (`PackedWeight.generation`: only the slots written since are repacked, into the cached copy). An
    inference tensor (made under `torch.inference_mode`) has no version counter, and a weight marked
    unstable is written untracked: those without write counts are repacked on every call, never cached."""
    kind = scales()
    if w.generation is not None and w.stable:
        return _slots_repacked(w, kind)
    if not _cached_whole(w):
        return repack(w, kind)
    key, version = id(w.data), (w.data._version, w.scale._version, kind)
    hit = _CACHE.get(key)
    if hit is None or hit[2] != version:
        if hit is None:
            weakref.finalize(w.data, _CACHE.pop, key, None)
        hit = _CACHE[key] = (*repack(w, kind), version)
    return hit[0], hit[1]


def repack_ahead(weights: list[PackedWeight]) -> list[torch.Tensor]:
    """`repacked` of every int4 CPU weight here that caches its copy, now (a loader's, before the first
    call): the interleaved data and scales the int4 kernels read, returned so that the caller can move
    them into 2 MiB pages (`model.hugepages`; torch's 4 KiB pages made a 364M int4 decode step ~11 %
    longer, docs/cpu.md). Weights repacked on every call or slot by slot are left out, and every weight when
    the interleaved kernels are switched off (`runtime.Q4_INTERLEAVED`)."""
    out = []
    for w in weights if runtime.Q4_INTERLEAVED else []:
        if w.fmt is WeightFormat.INT4 and w.data.device.type == "cpu" and _cached_whole(w):
            out.extend(repacked(w))
    return out


def _cached_whole(w: PackedWeight) -> bool:
    """Whether `repacked` keeps one cached copy of w (not the slots of an offloading cache, nor a weight it
    must repack on every call: unstable, or an inference tensor without a version counter)."""
    return w.stable and w.generation is None and not (w.data.is_inference() or w.scale.is_inference())


def _slots_repacked(w: PackedWeight, kind: Scales) -> tuple[torch.Tensor, torch.Tensor]:
    """`repacked` of a weight [P, N, K/2] whose slots count their writes (w.generation [P]): the cached
    copy [P, ...] with the slots written since the last call repacked again, one by one."""
    key, now = id(w.data), w.generation.clone()  # [P]: a snapshot (a prefetch thread may write meanwhile)
    hit = _CACHE.get(key)
    if hit is None or hit[2][0] != kind:
        if hit is None:
            weakref.finalize(w.data, _CACHE.pop, key, None)
        hit = _CACHE[key] = (*repack(w, kind), (kind, now))
        return hit[0], hit[1]
    seen = hit[2][1]  # [P]
    for i in (now != seen).nonzero().flatten().tolist():
        d, sc = repack(PackedWeight(w.data[i], w.scale[i], w.fmt, w.group_size), kind)
        hit[0][i], hit[1][i] = d, sc
        seen[i] = now[i]
    return hit[0], hit[1]


def interleaved(w: PackedWeight) -> bool:
    """Whether the fused decode layer takes this int4 projection repacked: `runtime.Q4_INTERLEAVED` on and
    N a multiple of 16 (its kernels size y by the weight's rows; `linear` cuts padded rows itself)."""
    return runtime.Q4_INTERLEAVED and w.data.shape[-2] % ROWS == 0


def x_order(K: int, group: int) -> torch.Tensor:
    """[K] the column of x at each position of the kernels' int8 row: per group, per chunk of 4 bytes
    (8 weights), its 4 even columns then its 4 odd ones."""
    j = torch.arange(K)
    g, r = j // group, j % group
    c, p, i = r // 8, (r // 4) % 2, r % 4
    return g * group + 2 * (CHUNK * c + i) + p


def x_parts(rows: int) -> int:
    """The int8 parts x takes in a call (an expert) of `rows` x rows (`_jit_q4r.parts`)."""
    return runtime.Q4_X_PARTS_FEW if rows <= FEW_ROWS else runtime.Q4_X_PARTS


def x_levels(parts: int) -> int:
    """x on the interleaved kernels moves by at most absmax(group) / (2·levels): 127·254^(parts − 1)."""
    return 127 * int(PART) ** (parts - 1)


def quantize_x_ref(x: torch.Tensor, group: int, parts: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 → (xq [M, parts, K] int8 in column order (not the kernels' order), xd [M, G] =
    absmax/127): the kernels' rounding (`_jit_q4r.quantize_row`: round half to even of v = x·127/absmax,
    per group, then of each part's residual (v − q)·254, in fp32): x ≈ xd·Σ_p xq_p·254⁻ᵖ."""
    M, K = x.shape
    xg = x.reshape(M, K // group, group)
    top = xg.abs().amax(-1)  # [M, G]
    inv = torch.where(top > 0, 127 / top, torch.zeros_like(top))
    v = xg * inv[..., None]  # [M, G, group] fp32, in steps of the first part
    qs = []
    for _ in range(parts):
        q = torch.round(v).clamp(-127, 127)
        qs.append(q.to(torch.int8).reshape(M, K))
        v = (v - q) * PART
    return torch.stack(qs, dim=1), top / 127


def linear_q4r_ref(x: torch.Tensor, w: PackedWeight, parts: int | None = None) -> torch.Tensor:
    """Twin of the interleaved int4 kernels: x rounded as they round it (`parts`: as a call of x's rows
    takes, `x_parts`), each part's group sums exact (int64), Σ_p 254⁻ᵖ·sum_p times both scales (the ones
    a call of x's rows reads: fp16 or fp32, `scale_fp16`), summed in float64. [M, K] fp32 → [M, N] fp32."""
    M, K = x.shape
    parts = x_parts(M) if parts is None else parts
    xq, xd = quantize_x_ref(x, w.group_size, parts)  # [M, P, K], [M, G]
    G = K // w.group_size
    b = w.data.to(torch.int64)  # [N, K/2]
    q = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(-1, G, w.group_size) - 8  # [N, G, group]
    acc = torch.einsum("mpgk,ngk->mpng", xq.to(torch.int64).reshape(M, parts, G, w.group_size), q)  # [M, P, N, G]
    weights = PART ** -torch.arange(parts, dtype=torch.float64)  # [P]
    total = (acc.double() * weights[None, :, None, None]).sum(1)  # [M, N, G]
    scale = (w.scale.half() if scale_fp16(M) else w.scale).double()  # [N, G]: the scales the call reads
    return (total * scale[None] * xd.double()[:, None, :]).sum(-1).float()
