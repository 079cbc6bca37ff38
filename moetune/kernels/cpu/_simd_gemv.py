"""The fp32 GEMV tile of four weight rows (numba `@intrinsic`, LLVM vector IR; imported by `_jit_tiles`).

  gemv4_f32(x, m, w, n0, n1, n2, n3) → (Σ_k x[m, k]·w[n_i, k] for i in 0..3)
      x fp32 [M, K], w fp32 [N, K], both C-contiguous: four read streams in one pass over x row m.

The sums run in <16 x float> accumulators, two sets (32 columns a step, eight independent chains for
the FMA latency), then a scalar tail for K mod 32 and a halving horizontal sum. Each 64-byte load of a
weight row also requests the line AHEAD_BYTES on into L2 (`_prefetch.prefetch_l2_ir`): past the row's
end that is a later row of the same matrix, which this work item reads a pass or two later; past the
array's end a prefetch never faults. The plain numba loop this replaces for fp32 rows
(`_jit_tiles._dot_rows4_loop`, still the path of int8 rows widened to fp32) left the streams to the
hardware prefetcher, which on the Intel Xeon host kept a one-row step at 0.80–0.82× llama.cpp's f32
(docs/cpu.md, "fp32 decode b=1: sixteen KiB ahead").
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from moetune.kernels.cpu._prefetch import prefetch_l2_ir

I32, I64, F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
VF = ir.VectorType(F32, 16)  # one 64-byte line of fp32
SETS = 2  # accumulator sets: 2 × 4 rows = 8 independent FMA chains
AHEAD_BYTES = 16384  # each weight line load requests the line this far on (A/B: docs/cpu.md)
FAST = ("fast",)


def _row_ptr(context, builder, aty, arg, row):
    """(float* to row `row` of a C-contiguous 2-D fp32 array, its row length)."""
    ary = context.make_array(aty)(context, builder, arg)
    inner = cgutils.unpack_tuple(builder, ary.shape)[1]
    return builder.gep(builder.bitcast(ary.data, F32.as_pointer()), [builder.mul(row, inner)]), inner


def _hsum(builder, vec, n: int):
    """Σ of an <n x float> vector's lanes (halving shuffles)."""
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        vec = builder.fadd(lo, hi, flags=FAST)
    return builder.extract_element(vec, I32(0))


def _vector_steps(builder, xp, wps, K):
    """The full steps of 16·SETS columns: accs[set][row] <16 x float> allocas; returns (accs, the columns done)."""
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(VF, None)) for _ in wps] for _ in range(SETS)]
    step = 16 * SETS
    done = builder.mul(builder.sdiv(K, I64(step)), I64(step))
    with cgutils.for_range_slice(builder, I64(0), done, I64(step)) as (k0, _):
        for s in range(SETS):
            k = builder.add(k0, I64(16 * s))
            xv = builder.load(builder.bitcast(builder.gep(xp, [k]), VF.as_pointer()), align=4)
            for acc, wp in zip(accs[s], wps):
                wv = builder.load(builder.bitcast(builder.gep(wp, [k]), VF.as_pointer()), align=4)
                prefetch_l2_ir(builder, builder.gep(wp, [builder.add(k, I64(AHEAD_BYTES // 4))]))
                builder.store(builder.fadd(builder.load(acc), builder.fmul(xv, wv, flags=FAST), flags=FAST), acc)
    return accs, done


def _codegen(context, builder, sig, args):
    m = context.cast(builder, args[1], sig.args[1], types.intp)
    rows = [context.cast(builder, args[i], sig.args[i], types.intp) for i in (3, 4, 5, 6)]
    xp, K = _row_ptr(context, builder, sig.args[0], args[0], m)
    wps = [_row_ptr(context, builder, sig.args[2], args[2], r)[0] for r in rows]
    accs, done = _vector_steps(builder, xp, wps, K)
    tails = [cgutils.alloca_once_value(builder, F32(0.0)) for _ in wps]
    with cgutils.for_range_slice(builder, done, K, I64(1)) as (k, _):  # K mod 32 columns, one at a time
        xk = builder.load(builder.gep(xp, [k]))
        for t, wp in zip(tails, wps):
            prod = builder.fmul(xk, builder.load(builder.gep(wp, [k])), flags=FAST)
            builder.store(builder.fadd(builder.load(t), prod, flags=FAST), t)
    outs = []
    for i, t in enumerate(tails):
        v = builder.load(accs[0][i])
        for s in range(1, SETS):
            v = builder.fadd(v, builder.load(accs[s][i]), flags=FAST)
        outs.append(builder.fadd(_hsum(builder, v, 16), builder.load(t), flags=FAST))
    return context.make_tuple(builder, sig.return_type, outs)


def _fp32_c(a, ndim: int) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" and a.ndim == ndim


@intrinsic
def gemv4_f32(typingctx, x, m, w, n0, n1, n2, n3):
    if not (_fp32_c(x, 2) and _fp32_c(w, 2)):
        return None
    return types.UniTuple(types.float32, 4)(x, m, w, n0, n1, n2, n3), _codegen
