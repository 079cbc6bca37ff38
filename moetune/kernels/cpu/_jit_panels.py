"""Panels of a packed weight widened to fp32 for torch's GEMM (prefill; `panels.py`): one pass, in place.

The values are `formats.dequantize`'s bit for bit: q · scale in fp32 (int8: a scale per row; int4: the
nibble minus 8, a scale per group, the low nibble first)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moetune.kernels.cpu._opts import OPTS


@njit(parallel=True, **OPTS)
def dequant_int8_rows(w, s, r0, out):
    """w [N, K] int8, s [N] fp32 → out [P, K] = w[r0:r0+P] · s[r0:r0+P, None]."""
    P, K = out.shape
    for i in prange(P):
        si = s[r0 + i]
        for k in range(K):
            out[i, k] = np.float32(w[r0 + i, k]) * si


@njit(parallel=True, **OPTS)
def dequant_int4_rows(w, s, r0, out):
    """w [N, K/2] uint8 (two nibbles a byte, low first), s [N, G] fp32 → out [P, K] =
    (nibble - 8) · s[row, k // (K / G)] for rows r0:r0+P."""
    P, K = out.shape
    group = K // s.shape[1]
    for i in prange(P):
        for g in range(s.shape[1]):
            sg = s[r0 + i, g]
            for j in range(group // 2):
                b = w[r0 + i, (g * group) // 2 + j]
                k = g * group + 2 * j
                out[i, k] = np.float32(np.int32(b & 15) - 8) * sg
                out[i, k + 1] = np.float32(np.int32(b >> 4) - 8) * sg
