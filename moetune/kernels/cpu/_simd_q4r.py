"""The int4 tile of the interleaved layout (numba `@intrinsic`, LLVM vector IR; imported by `_jit_q4r`).

Layout (`q4r.repack`): the int4 rows of a weight in blocks of 16 rows; within a block, for each
group g and each 4-byte chunk c of the group's bytes, the 4 bytes of row 0, then row 1, ... row 15:
one 64-byte vector holds chunk c of 16 rows (8 weights each: 4 low nibbles = even columns, 4 high =
odd columns, the byte order of `formats.quantize_int4`). Scales [NB, G, 16] in fp32, or fp16 (their
bits as int16, widened by `vcvtph2ps`; llama.cpp's Q4_0 keeps fp16 scales): the block's 16 rows' scales
of group g side by side. x is rounded per group in P int8 parts (the first Q8_0-style: step absmax/127;
each next one the rounded residual in steps 254 times finer: x ≈ xd·Σ_p xq_p·254⁻ᵖ) in the order of the
chunks: for each group, for each chunk c, its 4 even then its 4 odd columns (part p of row m at
xq[m, pK:]), with xd [M, G] the group scales and xc [M, P·G] = −8·Σ_group xq_p (the nibbles' zero point).

  q4r_tile_R[pP](xq, xd, xc, r, w, s, nb, out, orow, ocol)
      out[orow + i, ocol + l] = Σ_g s[nb, g, l]·xd[r + i, g]·Σ_p 254⁻ᵖ·S_p,
      S_p = xc[r + i, pG + g] + Σ_{k in g} xq[r + i, pK + k]·q[16·nb + l, k]
      for i < R (1, 2, 4 x rows), p < P (1, 2, 3 parts), l < 16 (the block's rows): w uint8 [Npad, G, H]
      (interleaved, H bytes per row and group), s fp32 or int16 (fp16 bits) [NB, G, 16], xq int8 [M, P·K],
      xd fp32 [M, G], xc int32 [M, P·G], out fp32. Each part has its own int32 accumulator (P chains).

One 64-byte load, one shift and two ands serve 16 weight rows and R x rows; x's 4 even (odd) int8 of a
chunk are broadcast to the 16 int32 lanes, one lane per weight row, so no horizontal sum is left:
the 16 lanes are the 16 outputs. Integer dot of 4 unsigned nibbles × 4 signed int8 into int32 lanes:
VNNI `vpdpbusd` (AVX-512 VNNI zmm, AVX-VNNI ymm), else `vpmaddubsw` (no saturation: ≤ 2·15·127 per
pair, ≤ 4·15·127 after adding the odd chunk's) then `vpmaddwd` by ones; generic IR without AVX2.
A part's group sum is exact in int32 (|partial sums| ≤ 8·g·127 + 15·g·127 = 373,888 at g = 128, far from
2³¹), converted once; the parts combined in fp32 (Horner: (S_2/254 + S_1)/254 + S_0) and scaled per lane.
With 1 or 2 parts (decode, where a step reads each weight line once) each 64-byte load also requests
the line AHEAD_BYTES on into L2 (`_prefetch.prefetch_l2_ir`; across the end of a block into the next,
which the same work item reads next; past the array's end a prefetch never faults); the 3-part tiles
(prefill, arithmetic-bound) do not.

numba inlines these tiles into their callers; `_cache` stamps every kernel with a hash of all of
kernels/cpu's sources, so an edit here recompiles the callers on their next first call.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from moetune.kernels.cpu._prefetch import prefetch_l2_ir

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
FAST = ("fast",)
ROWS = 16  # weight rows per interleaved block (one int32 lane each)
PART = 254.0  # ratio of one x part's step to the next's (`_jit_q4r.quantize_row`)
SPAN = 4  # chunks per step of the chunk loop (unrolled; without VNNI their int16 sums widened once)
AHEAD_BYTES = 4096  # the 1- and 2-part tiles (decode's) request the line this far past each weight load
V8, V16, V32 = ir.VectorType(I8, 64), ir.VectorType(I16, 32), ir.VectorType(I32, 16)
VF = ir.VectorType(F32, 16)


def _has(feature: str) -> bool:
    """Whether numba compiles for `feature` (NUMBA_CPU_FEATURES, else the host's: `isa.choose` sets them)."""
    from llvmlite import binding
    from numba.core import config

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else binding.get_host_cpu_features().flatten()
    return f"+{feature}" in features.split(",")


def _row_ptr(context, builder, aty, arg, row, elem):
    """A typed pointer to row `row` (intp) of a C-contiguous array (its first axis), and the array."""
    ary = context.make_array(aty)(context, builder, arg)
    inner = I64(1)
    for d in cgutils.unpack_tuple(builder, ary.shape)[1:]:
        inner = builder.mul(inner, d)
    return builder.gep(builder.bitcast(ary.data, elem.as_pointer()), [builder.mul(row, inner)]), ary


def _load(builder, base, k, vty):
    """Unaligned <n x T> load at base[k]."""
    return builder.load(builder.bitcast(builder.gep(base, [k]), vty.as_pointer()), align=1)


def _splat(builder, value, ty, n):
    v = builder.insert_element(ir.Constant(ir.VectorType(ty, n), None), value, I32(0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), [0] * n))


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _halves(builder, v, n):
    """<2n x T> → (low <n x T>, high <n x T>)."""
    return tuple(builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(o, o + n))))
                 for o in (0, n))


def _join(builder, a, b, n):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))


def _dot8(builder, acc, lo, xe, hi, xo):
    """acc <16 x i32> + Σ of each lane's 4 lo·xe + 4 hi·xo products (lo, hi unsigned nibbles <64 x i8>,
    xe, xo signed <64 x i8>)."""
    if _has("avx512vnni") and _has("avx512bw"):
        acc = _call(builder, "llvm.x86.avx512.vpdpbusd.512", V32, [acc, builder.bitcast(lo, V32), builder.bitcast(xe, V32)])
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", V32, [acc, builder.bitcast(hi, V32), builder.bitcast(xo, V32)])
    if _has("avxvnni") or (_has("avx512vnni") and _has("avx512vl")):
        h8 = ir.VectorType(I32, 8)
        outs = []
        for a, l, e, h, o in zip(_halves(builder, acc, 8), _halves(builder, lo, 32), _halves(builder, xe, 32),
                                 _halves(builder, hi, 32), _halves(builder, xo, 32)):
            a = _call(builder, "llvm.x86.avx512.vpdpbusd.256", h8, [a, builder.bitcast(l, h8), builder.bitcast(e, h8)])
            outs.append(_call(builder, "llvm.x86.avx512.vpdpbusd.256", h8, [a, builder.bitcast(h, h8), builder.bitcast(o, h8)]))
        return _join(builder, outs[0], outs[1], 8)
    return _widen(builder, acc, _pairs(builder, lo, xe, hi, xo))


def _vnni() -> bool:
    """Whether `_dot8` adds into int32 lanes with VNNI (else the int16 pairs of `_pairs` + `_widen`)."""
    return (_has("avx512vnni") and (_has("avx512bw") or _has("avx512vl"))) or _has("avxvnni")


def _pairs(builder, lo, xe, hi, xo):
    """<32 x i16>: per pair of bytes, lo·xe + lo'·xe' + hi·xo + hi'·xo' (`vpmaddubsw` ×2 + `vpaddw`;
    ≤ 4·15·127 = 7,620, no saturation) — without AVX2 in generic IR."""
    if _has("avx512bw"):
        return builder.add(_call(builder, "llvm.x86.avx512.pmaddubs.w.512", V16, [lo, xe]),
                           _call(builder, "llvm.x86.avx512.pmaddubs.w.512", V16, [hi, xo]))
    if _has("avx2"):
        h16 = ir.VectorType(I16, 16)
        outs = [builder.add(_call(builder, "llvm.x86.avx2.pmadd.ub.sw", h16, [l, e]),
                            _call(builder, "llvm.x86.avx2.pmadd.ub.sw", h16, [h, o]))
                for l, e, h, o in zip(_halves(builder, lo, 32), _halves(builder, xe, 32), _halves(builder, hi, 32),
                                      _halves(builder, xo, 32))]
        return _join(builder, outs[0], outs[1], 16)
    wide = ir.VectorType(I16, 64)
    p = builder.add(builder.mul(builder.zext(lo, wide), builder.sext(xe, wide)),
                    builder.mul(builder.zext(hi, wide), builder.sext(xo, wide)))
    return builder.add(builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(I32, 32), list(range(0, 64, 2)))),
                       builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(I32, 32), list(range(1, 64, 2)))))


def _widen(builder, acc, p16):
    """acc <16 x i32> + the int16 pairs p16 <32 x i16> summed by twos (`vpmaddwd` by ones)."""
    if _has("avx512bw"):
        return builder.add(acc, _call(builder, "llvm.x86.avx512.pmaddw.d.512", V32, [p16, ir.Constant(V16, [1] * 32)]))
    if _has("avx2"):
        h8, h16 = ir.VectorType(I32, 8), ir.VectorType(I16, 16)
        outs = [_call(builder, "llvm.x86.avx2.pmadd.wd", h8, [h, ir.Constant(h16, [1] * 16)])
                for h in _halves(builder, p16, 16)]
        return builder.add(acc, _join(builder, outs[0], outs[1], 8))
    w = builder.sext(p16, ir.VectorType(I32, 32))
    return builder.add(acc, builder.add(builder.shuffle_vector(w, w, ir.Constant(V32, list(range(0, 32, 2)))),
                                        builder.shuffle_vector(w, w, ir.Constant(V32, list(range(1, 32, 2))))))


def _half_to_float(builder, bits):
    """<16 x i16> fp16 bits → <16 x float>: `vcvtph2ps` with F16C; without it (generic x86-64, where
    LLVM would call a runtime helper numba cannot link) in integer ops: normal numbers re-biased,
    zero and subnormals as mantissa·2⁻²⁴ (no scale is infinite or NaN)."""
    if _has("f16c"):
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 16)), VF)
    h = builder.zext(bits, V32)
    c = lambda v: ir.Constant(V32, [v] * 16)  # noqa: E731
    sign = builder.shl(builder.and_(h, c(0x8000)), c(16))
    normal = builder.or_(builder.add(builder.shl(builder.and_(h, c(0x7FFF)), c(13)), c(112 << 23)), sign)
    tiny = builder.fmul(builder.uitofp(builder.and_(h, c(0x3FF)), VF), ir.Constant(VF, [2.0 ** -24] * 16))
    tiny = builder.or_(builder.bitcast(tiny, V32), sign)
    is_tiny = builder.icmp_unsigned("==", builder.and_(h, c(0x7C00)), c(0))
    return builder.bitcast(builder.select(is_tiny, tiny, normal), VF)


def _bcast4(builder, xp, off):
    """The 4 int8 at xp[off] broadcast to every 32-bit lane of a <64 x i8>."""
    v = builder.load(builder.bitcast(builder.gep(xp, [off]), I32.as_pointer()), align=1)
    return builder.bitcast(_splat(builder, v, I32, 16), V8)


def _scales(builder, sp, g, s_t):
    """The block's 16 rows' group-g scales as <16 x float>: fp32, or fp16 bits widened."""
    if s_t.dtype == types.float32:
        return _load(builder, sp, builder.mul(g, I64(ROWS)), VF)
    return _half_to_float(builder, _load(builder, sp, builder.mul(g, I64(ROWS)), ir.VectorType(I16, 16)))


def _q4r_codegen(R: int, P: int):
    def codegen(context, builder, sig, args):
        xq_t, xd_t, xc_t, _, w_t, s_t, _, out_t = sig.args[:8]
        r, nb, orow, ocol = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (3, 6, 8, 9))
        xrows = [builder.add(r, I64(i)) for i in range(R)]
        xps = [_row_ptr(context, builder, xq_t, args[0], m, I8)[0] for m in xrows]
        xdp = [_row_ptr(context, builder, xd_t, args[1], m, F32)[0] for m in xrows]
        xcp = [_row_ptr(context, builder, xc_t, args[2], m, I32)[0] for m in xrows]
        wp, wary = _row_ptr(context, builder, w_t, args[4], builder.mul(nb, I64(ROWS)), I8)
        elem = F32 if s_t.dtype == types.float32 else I16
        sp = _row_ptr(context, builder, s_t, args[5], nb, elem)[0]
        ops = [builder.gep(_row_ptr(context, builder, out_t, args[7], builder.add(orow, I64(i)), F32)[0], [ocol])
               for i in range(R)]
        G, H = cgutils.unpack_tuple(builder, wary.shape)[1:]
        C = builder.sdiv(H, I64(4))  # chunks per group
        K = builder.mul(G, builder.mul(H, I64(2)))  # x columns: part p of x row i at xq[i, p·K:]
        faccs = [cgutils.alloca_once_value(builder, ir.Constant(VF, None)) for _ in range(R)]
        low = ir.Constant(V8, [15] * 64)
        with cgutils.for_range(builder, G) as gl:
            g = gl.index
            iaccs = [[cgutils.alloca_once_value(builder, _splat(builder, builder.load(builder.gep(p, [builder.add(
                builder.mul(I64(q), G), g)])), I32, 16)) for q in range(P)] for p in xcp]  # [R][P]
            t0 = builder.mul(g, C)
            with cgutils.for_range(builder, builder.sdiv(C, I64(SPAN))) as cl:  # C: group/8, a multiple of 4
                tc = builder.add(t0, builder.mul(cl.index, I64(SPAN)))
                wide = _vnni()
                p16 = [[ir.Constant(V16, None) for _ in range(P)] for _ in range(R)]  # int16 sums (no VNNI)
                for j in range(SPAN):
                    t = builder.add(tc, I64(j))
                    v = _load(builder, wp, builder.mul(t, I64(64)), V8)
                    if P < 3:  # decode's tiles: the line a page on, into L2 (`AHEAD_BYTES`)
                        prefetch_l2_ir(builder, builder.gep(wp, [builder.add(builder.mul(t, I64(64)), I64(AHEAD_BYTES))]))
                    lo, hi = builder.and_(v, low), builder.lshr(v, ir.Constant(V8, [4] * 64))
                    for i in range(R):
                        for q in range(P):
                            off = builder.add(builder.mul(I64(q), K), builder.mul(t, I64(8)))
                            xe, xo = _bcast4(builder, xps[i], off), _bcast4(builder, xps[i], builder.add(off, I64(4)))
                            if wide:
                                builder.store(_dot8(builder, builder.load(iaccs[i][q]), lo, xe, hi, xo), iaccs[i][q])
                            else:
                                p16[i][q] = builder.add(p16[i][q], _pairs(builder, lo, xe, hi, xo))
                if not wide:  # ≤ SPAN·2·2·15·127 = 30,480 in each int16 lane: widened once per SPAN chunks
                    for i in range(R):
                        for q in range(P):
                            builder.store(_widen(builder, builder.load(iaccs[i][q]), p16[i][q]), iaccs[i][q])
            sv = _scales(builder, sp, g, s_t)
            for i in range(R):
                sc = builder.fmul(sv, _splat(builder, builder.load(builder.gep(xdp[i], [g])), F32, 16), flags=FAST)
                fv = builder.sitofp(builder.load(iaccs[i][P - 1]), VF)
                for q in range(P - 2, -1, -1):  # Σ_q acc_q·254^-q, lowest part first (Horner)
                    fv = builder.fadd(builder.fmul(fv, ir.Constant(VF, [1 / PART] * 16), flags=FAST),
                                      builder.sitofp(builder.load(iaccs[i][q]), VF), flags=FAST)
                builder.store(builder.fadd(builder.load(faccs[i]), builder.fmul(fv, sc, flags=FAST), flags=FAST), faccs[i])
        for i in range(R):
            builder.store(builder.load(faccs[i]), builder.bitcast(ops[i], VF.as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


def _q4r_tile(R: int, P: int):
    @intrinsic
    def tile(typingctx, xq, xd, xc, r, w, s, nb, out, orow, ocol):
        def arr(a, dt, nd):
            return isinstance(a, types.Array) and a.dtype in dt and a.layout == "C" and a.ndim == nd
        if not (arr(xq, (types.int8,), 2) and arr(xd, (types.float32,), 2) and arr(xc, (types.int32,), 2)
                and arr(w, (types.uint8,), 3) and arr(s, (types.int16, types.float32), 3)
                and arr(out, (types.float32,), 2)):
            return None
        return types.void(xq, xd, xc, r, w, s, nb, out, orow, ocol), _q4r_codegen(R, P)
    return tile



q4r_tile_1 = _q4r_tile(1, 1)
q4r_tile_2 = _q4r_tile(2, 1)
q4r_tile_4 = _q4r_tile(4, 1)
q4r_tile_1p2 = _q4r_tile(1, 2)
q4r_tile_2p2 = _q4r_tile(2, 2)
q4r_tile_4p2 = _q4r_tile(4, 2)
q4r_tile_1p3 = _q4r_tile(1, 3)
q4r_tile_2p3 = _q4r_tile(2, 3)
q4r_tile_4p3 = _q4r_tile(4, 3)  # 12 int32 accumulators: AVX-512's 32 registers hold them (`WIDE`)


def _wide() -> bool:
    """Whether the 4-row tile of 3 parts fits the registers: AVX-512's 32 zmm (AVX2: 16 ymm, two per vector)."""
    return _has("avx512bw")


WIDE = _wide()  # read when numba loads the kernels (`runtime.jit()`, after `isa.choose`), a compile-time constant
