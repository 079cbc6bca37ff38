"""Bytes per expert weight by storage format (what the simulator charges for reading, holding and
moving an expert). Weight-only formats: the GEMM still computes at the activation dtype.

| format | bytes per weight | why |
|---|---|---|
| none | the model dtype (2 bf16 on GPUs, 4 fp32 on CPU) | plain |
| fp8 | 1 + 4/128 | e4m3 + one fp32 scale per 128-block |
| int8 | 1 + 4/D | one fp32 scale per output channel (≈ 1) |
| int4 | 0.5 + 2/128 | two per byte + one fp16 scale per group of 128 |
"""

from __future__ import annotations

import numpy as np

LOW_FORMATS = ("none", "fp8", "int8", "int4")


def bytes_per_weight(fmt: str, dtype_bytes: int, D: int = 4096) -> float:
    if fmt == "none":
        return float(dtype_bytes)
    if fmt == "fp8":
        return 1 + 4 / 128
    if fmt == "int8":
        return 1 + 4 / D
    if fmt == "int4":
        return 0.5 + 2 / 128
    raise ValueError(f"unknown weight format '{fmt}'")


def expert_bytes(loads: np.ndarray, weights: int, dtype_bytes: int, low_format: str, hot_fraction: float,
                 D: int, high_format: str = "none") -> np.ndarray:
    """loads [Lm, E] → bytes of each expert [Lm, E]: the hottest ceil(hot_fraction·E) of each layer
    keep `high_format` (none: the model dtype; fp8: an fp8 checkpoint's own), the rest take `low_format`."""
    full = weights * bytes_per_weight(high_format, dtype_bytes, D)
    out = np.full(loads.shape, full, dtype=np.float64)
    if low_format == "none":
        return out
    E = loads.shape[1]
    hot = int(np.ceil(hot_fraction * E))
    low = weights * bytes_per_weight(low_format, dtype_bytes, D)
    order = np.argsort(-loads, axis=1, kind="stable")  # [Lm, E] hottest first
    cold = order[:, hot:]
    np.put_along_axis(out, cold, low, axis=1)
    return out
