"""Expert weight formats: pack a float weight into a named format and back, over the kernels' own
containers and quantisers (nothing is re-implemented here).

| name           | container (`kernels.quant_formats.PackedWeight`)     | quantiser                        |
|----------------|------------------------------------------------------|----------------------------------|
| fp32 bf16 fp16 | NONE, data in that dtype                             | a cast                           |
| fp8            | FP8: float8_e4m3fn data, fp32 scale per output row   | `kernels.quant_formats.quantize` |
| int8           | INT8: int8 data, fp32 scale per output row           | `kernels.cpu.quantize_int8`      |
| int4-gG        | INT4: two nibbles per byte, fp32 scale per G columns | `kernels.cpu.quantize_int4`      |

Both quantisers write the bytes the Triton kernels and the CPU kernels read (symmetric absmax
scales; int4 zero point 8). Group sizes per kernel: `names.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moetune.kernels.cpu.formats import INT4_GROUPS, quantize_int4, quantize_int8
from moetune.kernels.quant_formats import INT4_GROUP_SIZES, PackedWeight, WeightFormat, dequantize, quantize
from moetune.quant.names import (CPU_INT4_GROUPS, FORMAT_NAMES, TRITON_INT4_GROUPS, QuantError,  # noqa: F401
                                 check_backend, parse_name)

assert tuple(INT4_GROUPS) == CPU_INT4_GROUPS and tuple(INT4_GROUP_SIZES) == TRITON_INT4_GROUPS, \
    "kernel int4 group sizes changed: update moetune/quant/names.py"

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_KINDS = {"plain": WeightFormat.NONE, "fp8": WeightFormat.FP8, "int8": WeightFormat.INT8, "int4": WeightFormat.INT4}


@dataclass(frozen=True)
class ExpertFormat:
    name: str  # one of FORMAT_NAMES
    kind: WeightFormat
    dtype: torch.dtype | None = None  # plain formats only
    group: int = 0  # int4 only

    @property
    def bits(self) -> float:
        """Stored bits per weight, scales excluded."""
        if self.kind == WeightFormat.NONE:
            return 8.0 * self.dtype.itemsize
        return 4.0 if self.kind == WeightFormat.INT4 else 8.0

    def check_shape(self, k: int, what: str) -> None:
        parse_name(self.name).check_dim(k, what)


def parse_format(name: str) -> ExpertFormat:
    f = parse_name(name)
    return ExpertFormat(f.name, _KINDS[f.kind], _DTYPES.get(f.name), f.group)


def format_of(w: PackedWeight) -> str:
    """The name of a packed weight's format."""
    if w.fmt == WeightFormat.NONE:
        return next(n for n, d in _DTYPES.items() if d == w.data.dtype)
    return {WeightFormat.FP8: "fp8", WeightFormat.INT8: "int8"}.get(w.fmt) or f"int4-g{w.group_size}"


def pack(w: torch.Tensor, fmt: ExpertFormat) -> PackedWeight:
    """w [..., N, K] float → PackedWeight in `fmt` (an int4 group must divide K)."""
    fmt.check_shape(w.shape[-1], "K")
    if fmt.kind == WeightFormat.NONE:
        return PackedWeight(w.to(fmt.dtype).contiguous(), None, WeightFormat.NONE)
    if fmt.kind == WeightFormat.INT8:
        return quantize_int8(w)
    if fmt.kind == WeightFormat.INT4:
        return quantize_int4(w, fmt.group)
    flat = quantize(w.reshape(-1, *w.shape[-2:]), WeightFormat.FP8)  # [E, N, K], scales [E, N]
    return PackedWeight(flat.data.view(w.shape), flat.scale.view(w.shape[:-1]), WeightFormat.FP8)


def unpack(w: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """PackedWeight [E, N, ·] → [E, N, K] in `dtype` (the dequantised twin of every kernel)."""
    return dequantize(w, dtype)


def packed_bytes(w: PackedWeight) -> int:
    return w.data.nbytes + (w.scale.nbytes if w.scale is not None else 0)
