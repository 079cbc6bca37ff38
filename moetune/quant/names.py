"""Expert format names, torch-free (checkpoint validation reads them before torch is imported).

This is the one place the kernels' int4 group sizes are reconciled: the CPU kernels take groups of
32, 64 and 128 (`kernels.cpu.formats.INT4_GROUPS`), the Triton GEMM 64 and 128
(`kernels.quant_formats.INT4_GROUP_SIZES`); `formats.py` checks these tuples against the kernels'
own at import, and `backend_formats` says which names each kernel backend computes.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.errors import MoetuneError

CPU_INT4_GROUPS = (32, 64, 128)
TRITON_INT4_GROUPS = (64, 128)
PLAIN = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}  # name → safetensors dtype
FORMAT_NAMES = (*PLAIN, "fp8", "int8", *(f"int4-g{g}" for g in CPU_INT4_GROUPS))


class QuantError(MoetuneError):
    """A precision name, table or policy that cannot be used."""


@dataclass(frozen=True)
class FormatName:
    name: str
    kind: str  # plain | fp8 | int8 | int4
    group: int = 0  # int4 only

    def packed_shapes(self, n: int, k: int) -> tuple[tuple[int, ...], str, tuple[int, ...] | None]:
        """One expert's [n, k] weight → (data shape, safetensors dtype, scale shape or None; scales F32)."""
        if self.kind == "plain":
            return (n, k), PLAIN[self.name], None
        if self.kind == "int4":
            return (n, k // 2), "U8", (n, k // self.group)
        return (n, k), ("I8" if self.kind == "int8" else "F8_E4M3"), (n,)

    def check_dim(self, k: int, what: str) -> None:
        """An int4 group must divide the reduction dim of every weight it packs."""
        if self.kind == "int4" and k % self.group:
            fits = max((g for g in CPU_INT4_GROUPS if k % g == 0), default=0)
            hint = f"use int4-g{fits} or int8" if fits else "use int8"
            raise QuantError(f"format {self.name}: group size {self.group} does not divide {what}={k}; {hint}")


def parse_name(name: str) -> FormatName:
    """'int4-g64' → FormatName; an unknown name is one QuantError line listing the known ones."""
    if name in PLAIN:
        return FormatName(name, "plain")
    if name in ("fp8", "int8"):
        return FormatName(name, name)
    if isinstance(name, str) and name.startswith("int4-g") and name[6:].isdigit():
        group = int(name[6:])
        if group not in CPU_INT4_GROUPS:
            raise QuantError(f"format '{name}': int4 group size must be one of "
                             f"{', '.join(map(str, CPU_INT4_GROUPS))}")
        return FormatName(name, "int4", group)
    raise QuantError(f"unknown expert format '{name}' (choose from: {', '.join(FORMAT_NAMES)})")


def parse_dense(name: object) -> FormatName:
    """The dense projections' format (`moetune quantize --dense`, a recipe's quant.dense): int8 or int4-gG."""
    f = parse_name(name) if isinstance(name, str) and (name == "int8" or name.startswith("int4-g")) else None
    if f is None:
        raise QuantError(f"dense format '{name}': the dense projections take int8 or "
                         f"{', '.join(f'int4-g{g}' for g in CPU_INT4_GROUPS)}")
    return f


def backend_formats(backend: str) -> set[str]:
    """Format names a kernel backend computes directly."""
    if backend == "triton":
        return {*PLAIN, "fp8", "int8", *(f"int4-g{g}" for g in TRITON_INT4_GROUPS)}
    if backend == "cpu":
        return {"fp32", "int8", *(f"int4-g{g}" for g in CPU_INT4_GROUPS)}
    return set(FORMAT_NAMES)  # torch: the dequantise-then-matmul twin computes every format


def check_backend(names: set[str], backend: str) -> None:
    """Refuse formats a kernel backend cannot compute (e.g. int4-g32 under triton)."""
    allowed = backend_formats(backend)
    bad = sorted(set(names) - allowed)
    if bad:
        raise QuantError(f"kernel backend '{backend}' cannot compute expert format {bad[0]} "
                         f"(it takes: {', '.join(sorted(allowed))}); choose another format or --kernel-backend torch")
