"""Prefill matmuls of packed weights (`panels.py`): panels widened to fp32 for torch's GEMM, and x in
int8 parts for torch's integer GEMM.

Widened panels are `formats.dequantize`'s values bit for bit: q · scale in fp32 (int8: a scale per row;
int4: the nibble minus 8, a scale per group of 32, 64 or 128, the low nibble first). int4 goes through
`widen32`, LLVM vector IR: numba's loops over a group's 16-byte runs did not vectorise (7x int8's time).
The integer way (int8 weights as they are): `x_parts_rows` rounds x per row into int8 parts,
`torch._int_mm` multiplies, `combine_parts` sums the parts' int32 products back in fp32.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from moetune.kernels.cpu._opts import OPTS

I8, I32 = ir.IntType(8), ir.IntType(32)
F32 = ir.FloatType()
V16B, V32F = ir.VectorType(I8, 16), ir.VectorType(F32, 32)
INTERLEAVE = [j for i in range(16) for j in (i, 16 + i)]  # lo0, hi0, lo1, hi1, ...
PART = np.float32(254)  # ratio of one x part's step to the next's (as `_jit_q4r`'s)


def _widen32_codegen(context, builder, sig, args):
    w_t, _, _, o_t, _ = sig.args
    woff, ooff = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 4))
    wp = builder.bitcast(context.make_array(w_t)(context, builder, args[0]).data, I8.as_pointer())
    op = builder.bitcast(context.make_array(o_t)(context, builder, args[3]).data, F32.as_pointer())
    v = builder.load(builder.bitcast(builder.gep(wp, [woff]), V16B.as_pointer()), align=1)  # <16 x i8>
    lo = builder.and_(v, ir.Constant(V16B, [15] * 16))
    hi = builder.lshr(v, ir.Constant(V16B, [4] * 16))
    q = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), INTERLEAVE))  # <32 x i8>, 0..15
    f = builder.fsub(builder.uitofp(q, V32F), ir.Constant(V32F, [8.0] * 32))  # exact
    scale = builder.insert_element(ir.Constant(V32F, None), args[2], I32(0))
    scale = builder.shuffle_vector(scale, scale, ir.Constant(ir.VectorType(I32, 32), [0] * 32))
    builder.store(builder.fmul(f, scale), builder.bitcast(builder.gep(op, [ooff]), V32F.as_pointer()), align=4)
    return context.get_dummy_value()


@intrinsic
def widen32(typingctx, w, woff, scale, out, ooff):
    """out.flat[ooff : ooff + 32] = (nibbles of w.flat[woff : woff + 16], low first, minus 8) · scale
    (w uint8, out fp32, both C-contiguous; no bounds checks: the caller passes offsets inside them)."""
    if not (isinstance(w, types.Array) and w.dtype == types.uint8 and w.layout == "C"
            and isinstance(out, types.Array) and out.dtype == types.float32 and out.layout == "C"
            and scale == types.float32):
        return None
    return types.void(w, woff, scale, out, ooff), _widen32_codegen


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
    (nibble - 8) · s[row, k // (K / G)] for rows r0:r0+P (K / G a multiple of 32)."""
    P, K = out.shape
    group, H = K // s.shape[1], K // 2
    for i in prange(P):
        for c in range(K // 32):
            widen32(w, (r0 + i) * H + 16 * c, s[r0 + i, (32 * c) // group], out, i * K + 32 * c)


@njit(parallel=True, **OPTS)
def x_parts_rows(x, xq, d):
    """x [M, K] fp32 (any strides) → xq int8 [P·M, K] (part p of row m at row p·M + m), d [M]: per row,
    d = absmax/127, part 0 = round(x/d), each next part the rounded residual in steps PART times finer,
    so x ≈ d·Σ_p xq_p·PART⁻ᵖ (3 parts: within ~6e-8 of the row's absmax)."""
    M, K = x.shape
    P = xq.shape[0] // M
    for m in prange(M):
        amax = np.float32(0)
        for k in range(K):
            amax = max(amax, abs(x[m, k]))
        dm = amax / np.float32(127) if amax > 0 else np.float32(1)
        d[m] = dm
        inv = np.float32(1) / dm
        for k in range(K):
            r = x[m, k] * inv
            for p in range(P):
                q = min(max(np.round(r), np.float32(-127)), np.float32(127))
                xq[p * M + m, k] = np.int8(q)
                r = (r - q) * PART


@njit(parallel=True, **OPTS)
def combine_parts(acc, s, r0, d, out):
    """acc int32 [R, P·M] (row i: weight row r0 + i against each part of each x row), s [N] the weight's
    row scales, d [M] x's → out [R, M] = s[r0 + i]·d[m]·Σ_p acc[i, p·M + m]·PART⁻ᵖ (Horner, last part first)."""
    R, M = out.shape
    P = acc.shape[1] // M
    for i in prange(R):
        si = s[r0 + i]
        for m in range(M):
            t = np.float32(acc[i, (P - 1) * M + m])
            for p in range(P - 2, -1, -1):
                t = np.float32(acc[i, p * M + m]) + t / PART
            out[i, m] = t * si * d[m]
