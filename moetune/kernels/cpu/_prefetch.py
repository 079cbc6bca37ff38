"""`prefetch_row(w, n)`: ask the CPU to bring row n of a 2-D array into its L2 cache (x86
`prefetcht1`, LLVM's `llvm.prefetch` with locality 2), one request per 64-byte line.

Why: in the kernels' multi-row tiles (2+ x rows per weight row) the core spends long enough on each
weight line that the hardware prefetcher no longer keeps the stream ahead of it, and the time
becomes memory time plus compute time rather than the larger of the two. Asking for the weight rows
a few rows ahead into L2 overlaps them again: on the 2-core machine of issue 13, a [32000, 768] fp32
linear ran 1.16-1.30x faster at 2-16 rows (in-process A/B, 9 alternations). Into L1 (`prefetcht0`)
and non-temporal it was 4-12 % slower, and so was a whole-row burst for one x row (the per-line
requests below are another matter). Imported by `_jit` (numba only, never at package import).

`prefetch_l2_ir(builder, ptr)` emits the same request inside an `@intrinsic` tile: the int4 tiles
at decode (`_simd_q4r`, 1 and 2 parts of x) ask for the line 4 KiB past each 64-byte weight load —
the next page of the stream, which the hardware's L2 streamer does not cross into by itself (each
line there carries 128 weights of integer work, and the stream fell behind): on the Intel Xeon host
int4 decode b=1 steps went 1.32–1.59x faster (docs/cpu.md, "Int4 in interleaved blocks", *A page
ahead*). The fp32 four-row GEMV tile (`_simd_gemv`) asks 16 KiB ahead the same way, one request per
line as it reads (1.12–1.21x; docs/cpu.md, "fp32 decode b=1: sixteen KiB ahead").
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from moetune.kernels.cpu._opts import CACHED

LINE = 64  # bytes per request (x86 cache line)
_I32 = ir.IntType(32)


@intrinsic
def _prefetch_l2(typingctx, w, n, k):
    """One request: the line holding w[n, k] (w a 2-D array; no bounds check, a prefetch never faults)."""
    if not (isinstance(w, types.Array) and w.ndim == 2):
        return None
    sig = types.void(w, n, k)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        idx = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:])]
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, idx, wraparound=False, boundscheck=False)
        prefetch_l2_ir(builder, ptr)
        return context.get_dummy_value()

    return sig, codegen


def prefetch_l2_ir(builder: ir.IRBuilder, ptr) -> None:
    """Emit one request for the line holding `ptr` (any pointer type) into L2, in LLVM IR (for the
    `@intrinsic` tiles): read (0), locality 2 (x86 `prefetcht1`), data cache (1)."""
    i8p = ir.IntType(8).as_pointer()
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
                                        "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(ptr, i8p), _I32(0), _I32(2), _I32(1)])


@njit(**CACHED)
def prefetch_row(w, n):
    """Request every line of row n of w [N, K] into L2."""
    step = max(1, LINE // w.itemsize)
    for k in range(0, w.shape[1], step):
        _prefetch_l2(w, n, k)
