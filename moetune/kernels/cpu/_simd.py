"""Integer dot products written as LLVM vector IR (numba `@intrinsic`s; imported by `_jit_q8`).

Why not numba loops: numba types an int32 sum as int64, and LLVM narrows such a loop to `vpmaddwd`
only when each intermediate has a single use, so tiles of several rows (and the int4 nibble split)
compiled to 64-bit multiplies or 256-bit vectors (measured 0.3-0.9x the plain loops, issue 30).
Here each tile is emitted directly: unaligned vector loads, int8 → int16 widening, and
`pmaddwd` (`llvm.x86.avx512.pmaddw.d.512` / `llvm.x86.avx2.pmadd.wd`) added into int32 lanes,
which LLVM's x86 backend fuses into VNNI's `vpdpwssd` on CPUs that have it; without AVX2 the same
arithmetic is generic IR (multiply, even + odd lanes). The width is chosen from the features numba
compiles for (`NUMBA_CPU_FEATURES`, else the host's, as numba's own codegen does): the disk cache is
keyed on those features, so a cached kernel always matches its CPU.

  q8_tile_RxC(xq, xs, r, w, n, n2)
                                 Σ_b xs[r + i, b]·Σ_{k in block b} xq[r + i, k]·w[n_j, k] in fp32 for R x
                                 rows × C weight rows (xq int16 [M, K], xs fp32 [M, ⌈K/XB⌉] its block
                                 scales, w int8 [N, K]; C = 2 takes n and n2, C = 1 ignores n2): each
                                 block's sums exact in int32 lanes, converted and scaled once per block
                                 into fp32 lane accumulators → a tuple of R·C fp32, row-major in i
  q4_tile_RxC(xq, xsum, xs, r, w, n, n2, s)
                                 Σ_g s[n_j, g]·xs[r + i, g]·Σ_{k in g} xq[r + i, k]·(q[n_j, k] − 8) in
                                 fp32 for R ∈ {1, 2, 4} x rows × C ∈ {1, 2} weight rows (1×1, 1×2,
                                 2×1, 4×1, 2×2; each weight vector unpacked once for the R rows;
                                 each (row, weight row) sum the same arithmetic whatever the tile):
                                 xq int16 [M, 2, G, H] (even / odd columns, the order of
                                 `linear.split_int4_input`), xsum int32 [M, G] its group sums (kept
                                 in the signature, no longer read), xs fp32 [M, G] its group scales,
                                 w uint8 [N, G, H] (two nibbles a byte), s fp32 [N, G]. Nibbles are
                                 unpacked in-register (and / shift, − 8 on the bytes, sign-extended);
                                 a group's integer sum is exact, then converted and scaled per lane
                                 into fp32 lane accumulators: one horizontal sum per (row, weight
                                 row), a tuple of R·C fp32, row-major in i

No bounds checks: the callers pass rows inside the arrays and matching K.

numba's disk cache keys a cached kernel on its own source file only: after editing this file, delete
moetune/kernels/cpu/__pycache__/*.nb* (or the kernels that call these tiles keep the old code).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
FAST = ("fast",)
XB = 64  # x columns per scale against int8 weights (a multiple of 32, the widest step; A/B of 32 / 64 / 128: docs/cpu.md)


@functools.cache
def lanes() -> int:
    """int16 lanes per multiply-add: 32 (AVX-512BW), 16 (AVX2), 16 generic IR otherwise."""
    from llvmlite import binding
    from numba.core import config

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else binding.get_host_cpu_features().flatten()
    have = {f[1:] for f in features.split(",") if f.startswith("+")}
    return 32 if "avx512bw" in have else 16


def _has(feature: str) -> bool:
    from llvmlite import binding
    from numba.core import config

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else binding.get_host_cpu_features().flatten()
    return f"+{feature}" in features.split(",")


def _madd(builder: ir.IRBuilder, acc, a, b, width: int):
    """acc + pmaddwd(a, b): a, b <width x i16> → acc <width/2 x i32>."""
    half = ir.VectorType(I32, width // 2)
    name = {32: "llvm.x86.avx512.pmaddw.d.512", 16: "llvm.x86.avx2.pmadd.wd"}.get(width)
    if name and (width == 32 or _has("avx2")):
        vec = ir.VectorType(I16, width)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(half, [vec, vec]), name)
        return builder.add(acc, builder.call(fn, [a, b]))
    wide = ir.VectorType(I32, width)
    p = builder.mul(builder.sext(a, wide), builder.sext(b, wide))
    even = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(I32, width // 2), list(range(0, width, 2))))
    odd = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(I32, width // 2), list(range(1, width, 2))))
    return builder.add(acc, builder.add(even, odd))


def _hsum(builder: ir.IRBuilder, vec, n: int):
    """Σ of an <n x T> vector's lanes (halving shuffles)."""
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        vec = builder.add(lo, hi) if isinstance(vec.type.element, ir.IntType) else builder.fadd(lo, hi)
    return builder.extract_element(vec, I32(0))


def _row_ptr(context, builder, aty, arg, row, elem):
    """A typed pointer to row `row` (intp) of a C-contiguous array (its first axis)."""
    ary = context.make_array(aty)(context, builder, arg)
    inner = I64(1)
    for d in cgutils.unpack_tuple(builder, ary.shape)[1:]:
        inner = builder.mul(inner, d)
    data = builder.bitcast(ary.data, elem.as_pointer())
    return builder.gep(data, [builder.mul(row, inner)]), ary


def _load(builder, base, k, vty):
    """Unaligned <n x T> load at base[k]."""
    return builder.load(builder.bitcast(builder.gep(base, [k]), vty.as_pointer()), align=1)


def _q8_codegen(R: int, C: int):
    def codegen(context, builder, sig, args):
        xq_t, xs_t, _, w_t = sig.args[:4]
        r, n, n2 = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 5))
        wrows = [n, n2][:C]
        rows = [builder.add(r, I64(i)) for i in range(R)]
        xs = [_row_ptr(context, builder, xq_t, args[0], m, I16)[0] for m in rows]
        scs = [_row_ptr(context, builder, xs_t, args[1], m, F32)[0] for m in rows]
        wp = [_row_ptr(context, builder, w_t, args[3], m, I8) for m in wrows]
        K = cgutils.unpack_tuple(builder, wp[0][1].shape)[1]
        wp = [p for p, _ in wp]
        V = lanes()
        half = V // 2
        B = XB
        U = max(1, 4 // (R * C))  # independent fp32 accumulator sets (blocks round-robin): ≥ 4 chains
        acc_t, int_t = ir.VectorType(F32, half), ir.VectorType(I32, half)
        faccs = [[cgutils.alloca_once_value(builder, ir.Constant(acc_t, None)) for _ in range(R * C)]
                 for _ in range(U)]

        def steps(k0, count, iaccs):
            """iaccs (R·C <half x i32> values) += `count` vector steps from column k0."""
            for s in range(count):
                k = builder.add(k0, I64(s * V))
                wv = [builder.sext(_load(builder, p, k, ir.VectorType(I8, V)), ir.VectorType(I16, V)) for p in wp]
                for i in range(R):
                    xv = _load(builder, xs[i], k, ir.VectorType(I16, V))
                    for j in range(C):
                        iaccs[i * C + j] = _madd(builder, iaccs[i * C + j], xv, wv[j], V)
            return iaccs

        def scale_into(iaccs, b, sets):
            """sets += float(iaccs) · xs[r + i, b] (the block's exact sums, scaled once per block)."""
            for i in range(R):
                sv = _splat(builder, builder.load(builder.gep(scs[i], [b])), F32, half)
                for j in range(C):
                    a = sets[i * C + j]
                    fv = builder.sitofp(iaccs[i * C + j], acc_t)
                    builder.store(builder.fadd(builder.load(a), builder.fmul(fv, sv, flags=FAST), flags=FAST), a)

        nfull = builder.sdiv(K, I64(B))
        nu = builder.mul(builder.sdiv(nfull, I64(U)), I64(U))
        with cgutils.for_range_slice(builder, I64(0), nu, I64(U)) as (b, _):  # whole blocks, U at a time
            for u in range(U):
                bu = builder.add(b, I64(u))
                scale_into(steps(builder.mul(bu, I64(B)), B // V, [ir.Constant(int_t, None)] * (R * C)), bu, faccs[u])
        with cgutils.for_range_slice(builder, nu, nfull, I64(1)) as (b, _):
            scale_into(steps(builder.mul(b, I64(B)), B // V, [ir.Constant(int_t, None)] * (R * C)), b, faccs[0])
        # the last, partial block (K % B columns): vector steps, then one column at a time
        kt = builder.mul(nfull, I64(B))
        tails = [cgutils.alloca_once_value(builder, ir.Constant(int_t, None)) for _ in range(R * C)]
        kv = builder.add(kt, builder.mul(builder.sdiv(builder.sub(K, kt), I64(V)), I64(V)))
        with cgutils.for_range_slice(builder, kt, kv, I64(V)) as (k, _):
            for a, v in zip(tails, steps(k, 1, [builder.load(a) for a in tails])):
                builder.store(v, a)
        sums = [cgutils.alloca_once_value(builder, _hsum(builder, builder.load(a), half)) for a in tails]
        with cgutils.for_range_slice(builder, kv, K, I64(1)) as (k, _):
            wk = [builder.sext(builder.load(builder.gep(p, [k])), I32) for p in wp]
            for i in range(R):
                xk = builder.sext(builder.load(builder.gep(xs[i], [k])), I32)
                for j in range(C):
                    s = sums[i * C + j]
                    builder.store(builder.add(builder.load(s), builder.mul(xk, wk[j])), s)
        outs = []
        for i in range(R):
            has_tail = builder.icmp_signed("<", kt, K)
            tail_sc = builder.select(has_tail, builder.load(builder.gep(scs[i], [nfull])), F32(0.0))
            for j in range(C):
                total = builder.load(faccs[0][i * C + j])
                for sets in faccs[1:]:
                    total = builder.fadd(total, builder.load(sets[i * C + j]), flags=FAST)
                tail = builder.fmul(builder.sitofp(builder.load(sums[i * C + j]), F32), tail_sc)
                outs.append(builder.fadd(_hsum(builder, total, half), tail))
        return context.make_tuple(builder, sig.return_type, outs)
    return codegen


def _q8_tile(R: int, C: int):
    @intrinsic
    def tile(typingctx, xq, xs, r, w, n, n2):
        if not (isinstance(xq, types.Array) and xq.dtype == types.int16 and xq.layout == "C" and xq.ndim == 2
                and isinstance(xs, types.Array) and xs.dtype == types.float32 and xs.layout == "C" and xs.ndim == 2
                and isinstance(w, types.Array) and w.dtype == types.int8 and w.layout == "C" and w.ndim == 2):
            return None
        return types.UniTuple(types.float32, R * C)(xq, xs, r, w, n, n2), _q8_codegen(R, C)
    return tile


q8_tile_1x1 = _q8_tile(1, 1)
q8_tile_1x2 = _q8_tile(1, 2)
q8_tile_2x2 = _q8_tile(2, 2)
q8_tile_4x2 = _q8_tile(4, 2)


def _nibbles(builder, bytes_, V):
    """<V x i8> bytes → (low, high) nibbles minus 8 as signed <V x i16> (−8..7): the subtraction on
    bytes, before the widening, costs one op per V weights (the group's −8·Σ xq, added into lane 0
    per group and x row before, cost four)."""
    v8, v16 = ir.VectorType(I8, V), ir.VectorType(I16, V)
    eight = ir.Constant(v8, [8] * V)
    lo = builder.sub(builder.and_(bytes_, ir.Constant(v8, [15] * V)), eight)
    hi = builder.sub(builder.lshr(bytes_, ir.Constant(v8, [4] * V)), eight)
    return builder.sext(lo, v16), builder.sext(hi, v16)


def _splat(builder, value, ty, n):
    v = builder.insert_element(ir.Constant(ir.VectorType(ty, n), None), value, I32(0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), [0] * n))


def _q4_group(builder, wps, xps, base, GH, width, iaccs):
    """iaccs[i·C + j] += the pmaddwd lanes of `width` bytes of weight row j at `base` against x row
    i's even / odd columns (each weight vector unpacked once for every x row)."""
    xv = [(_load(builder, xp, base, ir.VectorType(I16, width)),
           _load(builder, xp, builder.add(GH, base), ir.VectorType(I16, width))) for xp in xps]
    C = len(wps)
    for j, wp in enumerate(wps):
        lo, hi = _nibbles(builder, _load(builder, wp, base, ir.VectorType(I8, width)), width)
        for i, (e, o) in enumerate(xv):
            a = iaccs[i * C + j]
            part = _madd(builder, _madd(builder, ir.Constant(ir.VectorType(I32, width // 2), None), e, lo, width),
                         o, hi, width)
            if width // 2 < a.type.pointee.count:  # a 16-byte group into the low half of a wider accumulator
                n = a.type.pointee.count
                part = builder.shuffle_vector(part, ir.Constant(part.type, None),
                                              ir.Constant(ir.VectorType(I32, n), list(range(n))))
            builder.store(builder.add(builder.load(a), part), a)


def _q4_codegen(R: int, C: int):
    def codegen(context, builder, sig, args):
        xq_t, xsum_t, xs_t, _, w_t, _, _, s_t = sig.args
        r, n, n2 = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (3, 5, 6))
        rows = [n, n2][:C]
        xrows = [builder.add(r, I64(i)) for i in range(R)]
        wps = [_row_ptr(context, builder, w_t, args[4], m, I8) for m in rows]
        sps = [_row_ptr(context, builder, s_t, args[7], m, F32)[0] for m in rows]
        xps = [_row_ptr(context, builder, xq_t, args[0], m, I16)[0] for m in xrows]
        xsps = [_row_ptr(context, builder, xs_t, args[2], m, F32)[0] for m in xrows]
        G, H = cgutils.unpack_tuple(builder, wps[0][1].shape)[1:]
        wps = [p for p, _ in wps]
        V = lanes()
        half = V // 2
        fast = FAST
        faccs = [cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(F32, half), None))
                 for _ in range(R * C)]
        GH = builder.mul(G, H)
        with cgutils.for_range(builder, G) as loop:
            g = loop.index
            base = builder.mul(g, H)
            iaccs = [cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(I32, half), None))
                     for _ in range(R * C)]
            with builder.if_else(builder.icmp_signed("==", H, I64(V))) as (one, other):
                with one:  # the group is one step: straight-line code (g64 on AVX-512, g32 on AVX2)
                    _q4_group(builder, wps, xps, base, GH, V, iaccs)
                with other:
                    with builder.if_else(builder.icmp_signed("<", H, I64(V))) as (short, full):
                        with short:  # H = 16 < V (a group of 32 on AVX-512): one 16-byte step
                            _q4_group(builder, wps, xps, base, GH, 16, iaccs)
                        with full:
                            with cgutils.for_range_slice(builder, I64(0), H, I64(V)) as (j, _):
                                _q4_group(builder, wps, xps, builder.add(base, j), GH, V, iaccs)
            for i in range(R):
                xg = builder.load(builder.gep(xsps[i], [g]))  # x row i's scale of this group
                for j, sp in enumerate(sps):
                    a, f = iaccs[i * C + j], faccs[i * C + j]
                    sv = _splat(builder, builder.fmul(builder.load(builder.gep(sp, [g])), xg), F32, half)
                    fv = builder.sitofp(builder.load(a), ir.VectorType(F32, half))
                    builder.store(builder.fadd(builder.load(f), builder.fmul(fv, sv, flags=fast), flags=fast), f)
        outs = [_hsum(builder, builder.load(f), half) for f in faccs]
        return context.make_tuple(builder, sig.return_type, outs)
    return codegen


def _q4_tile(R: int, C: int):
    @intrinsic
    def tile(typingctx, xq, xsum, xs, r, w, n, n2, s):
        if not (isinstance(xq, types.Array) and xq.dtype == types.int16 and xq.layout == "C" and xq.ndim == 4
                and isinstance(xsum, types.Array) and xsum.dtype == types.int32 and xsum.layout == "C"
                and xsum.ndim == 2
                and isinstance(xs, types.Array) and xs.dtype == types.float32 and xs.layout == "C" and xs.ndim == 2
                and isinstance(w, types.Array) and w.dtype == types.uint8 and w.layout == "C" and w.ndim == 3
                and isinstance(s, types.Array) and s.dtype == types.float32 and s.layout == "C" and s.ndim == 2):
            return None
        return types.UniTuple(types.float32, R * C)(xq, xsum, xs, r, w, n, n2, s), _q4_codegen(R, C)
    return tile


q4_tile_1x1 = _q4_tile(1, 1)
q4_tile_1x2 = _q4_tile(1, 2)
q4_tile_2x1 = _q4_tile(2, 1)
q4_tile_4x1 = _q4_tile(4, 1)
q4_tile_2x2 = _q4_tile(2, 2)
