"""The 16-position tiles of paged decode attention (numba `@intrinsic`, LLVM vector IR; imported by
`_jit_attention`). Both take 16 cache rows at once, by their flat element offsets (`offs` int64 [16]:
the row of position u of the chunk starts at k.flat[offs[u] + koff]; rows past the chunk's end repeat a
valid row, so no lane needs a guard), and walk the head dimension dh (a multiple of `LANES`) in
16-lane fp32 vectors:

  dots16(q, qoff, k, offs, koff, dh, s)
      s[u] = Σ_{d < dh} q.flat[qoff + d]·k.flat[offs[u] + koff + d] for u < 16: 16 vertical FMA chains
      (one per position, each q vector loaded once for the 16), then the 16 lane vectors summed
      into one vector of 16 scores by a 4-stage shuffle tree (15 two-source shuffle pairs, not a
      horizontal sum per score)
  axpy16(w, v, offs, voff, dh, acc, aoff)
      acc.flat[aoff + d] += Σ_{u < 16} w[u]·v.flat[offs[u] + voff + d] for d < dh: each weight broadcast
      once, four accumulator chains over the positions, acc read and written once per vector

q, k, v, acc: C-contiguous fp32 arrays (any rank); s, w fp32 [≥ 16]. No bounds checks: the caller
passes offsets inside the arrays. Generic vector IR: LLVM splits a 16-lane vector into the CPU's
width (AVX-512 zmm, AVX2 two ymm).

numba's disk cache keys a kernel on its own source file only: after editing this file delete
moetune/kernels/cpu/__pycache__/_jit_attention*.nb* (or the kernels that call these tiles keep the old code).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I32, I64 = ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
FAST = ("fast",)
LANES = 16  # positions per tile, and fp32 lanes per vector
VF = ir.VectorType(F32, LANES)


def _data(context, builder, aty, arg):
    """float* to the first element of a C-contiguous fp32 array."""
    return builder.bitcast(context.make_array(aty)(context, builder, arg).data, F32.as_pointer())


def _load(builder, base, k):
    """Unaligned <16 x float> at base[k]."""
    return builder.load(builder.bitcast(builder.gep(base, [k]), VF.as_pointer()), align=4)


def _store(builder, value, base, k):
    builder.store(value, builder.bitcast(builder.gep(base, [k]), VF.as_pointer()), align=4)


def _splat(builder, value):
    v = builder.insert_element(ir.Constant(VF, None), value, I32(0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, LANES), [0] * LANES))


def _offsets(context, builder, aty, arg):
    """The 16 row offsets (int64) as values."""
    p = builder.bitcast(context.make_array(aty)(context, builder, arg).data, I64.as_pointer())
    return [builder.load(builder.gep(p, [I64(u)])) for u in range(LANES)]


def _tree_sum(builder, vecs):
    """16 vectors → one whose lane u is Σ of vecs[u]'s lanes. A stage of half-width h (8, 4, 2, 1
    lanes: the wide cross-lane shuffles first, while there are most vectors; in-lane ones last)
    pairs neighbours A, B: lane l of the result takes A[l] + A[l + h] where bit h of l is 0, else
    B[l - h] + B[l]. The vectors enter in bit-reversed order, so lane u ends with position u."""
    rev = [int(f"{u:04b}"[::-1], 2) for u in range(LANES)]
    vecs = [vecs[r] for r in rev]
    h = LANES // 2
    while len(vecs) > 1:
        lo = [l if not l & h else LANES + l - h for l in range(LANES)]
        hi = [l + h if not l & h else LANES + l for l in range(LANES)]
        mask_lo, mask_hi = (ir.Constant(ir.VectorType(I32, LANES), m) for m in (lo, hi))
        vecs = [builder.fadd(builder.shuffle_vector(a, b, mask_lo), builder.shuffle_vector(a, b, mask_hi), flags=FAST)
                for a, b in zip(vecs[0::2], vecs[1::2])]
        h //= 2
    return vecs[0]


def _dots_codegen(context, builder, sig, args):
    q_t, _, k_t, o_t, _, _, s_t = sig.args
    qoff, koff, dh = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 4, 5))
    qp, kp, sp = (_data(context, builder, t, a) for t, a in ((q_t, args[0]), (k_t, args[2]), (s_t, args[6])))
    offs = [builder.add(o, koff) for o in _offsets(context, builder, o_t, args[3])]
    accs = [cgutils.alloca_once_value(builder, ir.Constant(VF, [0.0] * LANES)) for _ in range(LANES)]
    with cgutils.for_range(builder, builder.sdiv(dh, I64(LANES))) as loop:
        d = builder.mul(loop.index, I64(LANES))
        qv = _load(builder, qp, builder.add(qoff, d))
        for u in range(LANES):
            kv = _load(builder, kp, builder.add(offs[u], d))
            builder.store(builder.fadd(builder.load(accs[u]), builder.fmul(qv, kv, flags=FAST), flags=FAST), accs[u])
    _store(builder, _tree_sum(builder, [builder.load(a) for a in accs]), sp, I64(0))
    return context.get_dummy_value()


def _axpy_codegen(context, builder, sig, args):
    w_t, v_t, o_t, _, _, a_t, _ = sig.args
    voff, dh, aoff = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (3, 4, 6))
    wp, vp, ap = (_data(context, builder, t, a) for t, a in ((w_t, args[0]), (v_t, args[1]), (a_t, args[5])))
    offs = [builder.add(o, voff) for o in _offsets(context, builder, o_t, args[2])]
    ws = [_splat(builder, builder.load(builder.gep(wp, [I64(u)]))) for u in range(LANES)]
    with cgutils.for_range(builder, builder.sdiv(dh, I64(LANES))) as loop:
        d = builder.mul(loop.index, I64(LANES))
        chains = [None] * 4
        for u in range(LANES):
            term = builder.fmul(ws[u], _load(builder, vp, builder.add(offs[u], d)), flags=FAST)
            c = chains[u % 4]
            chains[u % 4] = term if c is None else builder.fadd(c, term, flags=FAST)
        total = builder.fadd(builder.fadd(chains[0], chains[1], flags=FAST),
                             builder.fadd(chains[2], chains[3], flags=FAST), flags=FAST)
        at = builder.add(aoff, d)
        _store(builder, builder.fadd(_load(builder, ap, at), total, flags=FAST), ap, at)
    return context.get_dummy_value()


def _f32(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C"


def _i64_1d(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.int64 and a.layout == "C" and a.ndim == 1


@intrinsic
def dots16(typingctx, q, qoff, k, offs, koff, dh, s):
    if not (_f32(q) and _f32(k) and _i64_1d(offs) and _f32(s)):
        return None
    return types.void(q, qoff, k, offs, koff, dh, s), _dots_codegen


@intrinsic
def axpy16(typingctx, w, v, offs, voff, dh, acc, aoff):
    if not (_f32(w) and _f32(v) and _i64_1d(offs) and _f32(acc)):
        return None
    return types.void(w, v, offs, voff, dh, acc, aoff), _axpy_codegen
