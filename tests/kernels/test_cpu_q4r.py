"""The interleaved int4 kernels (`kernels/cpu/q4r.py`, `_jit_q4r.py`, `_simd_q4r.py`; the default with
`runtime.Q4_INTERLEAVED` on): the repacked layout holds the checkpoint's weights (scales in fp32,
fp16, or both: `q4r.Scales`), x's int8 parts hold x within their stated step, and `linear` / the
grouped experts equal their integer twin (x rounded per group as the kernels round it, in 1, 2 or 3
int8 parts, exact integer sums, the scales a call of its rows reads: `q4r.linear_q4r_ref`) up to one
rounding step of x's last part, and the dequantised fp32 reference within `q8_bound`, on 1, 3-5, 16,
17 and 70 x rows (16 and 17+ take different parts, and by default different scales), N of 1, 15, 17,
37 (not multiples of the 16 interleaved rows), K of 3 groups, groups 32 / 64 / 128, serial and
parallel, in each numerics mode. Each instruction-set variant: test_cpu_isa.py."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from moetune.kernels.cpu import fused_experts_cpu, fused_experts_cpu_ref, linear, linear_ref, quantize_int4  # noqa: E402
from moetune.kernels.cpu import runtime  # noqa: E402
from moetune.kernels.cpu.formats import dequantize  # noqa: E402
from moetune.kernels.cpu.linear import q8_bound  # noqa: E402
from moetune.kernels.cpu.q4r import (ROWS, Scales, linear_q4r_ref, quantize_x_ref, repack, x_levels,  # noqa: E402
                                     x_order, x_parts)
from moetune.kernels.quant_formats import PackedWeight, WeightFormat  # noqa: E402
from tests.kernels.test_cpu_kernels import threads  # noqa: E402,F401  (the fixture: serial and parallel)


@pytest.fixture(autouse=True)
def interleaved(monkeypatch):
    monkeypatch.setattr(runtime, "Q4_INTERLEAVED", True)


MODES = [(2, 3, True, False), (1, 1, True, True), (2, 3, False, False), (3, 2, False, False)]
# (Q4_X_PARTS_FEW, Q4_X_PARTS, Q4_SCALE_FP16_FEW, Q4_SCALE_FP16): the default (fp16 scales up to 16 rows,
# fp32 beyond), llama.cpp's numerics (int8 x, fp16 scales), the exact mode, and the parts the other way round


def _fp(b: bool) -> str:
    return "fp16" if b else "fp32"


@pytest.fixture(params=MODES, ids=lambda p: f"parts{p[0]}-{p[1]}-{_fp(p[2])}-{_fp(p[3])}")
def parts(request, monkeypatch):
    few, many, fp16_few, fp16 = request.param
    monkeypatch.setattr(runtime, "Q4_X_PARTS_FEW", few)
    monkeypatch.setattr(runtime, "Q4_X_PARTS", many)
    monkeypatch.setattr(runtime, "Q4_SCALE_FP16_FEW", fp16_few)
    monkeypatch.setattr(runtime, "Q4_SCALE_FP16", fp16)
    return request.param


def _unpack_repacked(data: torch.Tensor, scale: torch.Tensor, N: int, group: int) -> torch.Tensor:
    """The repacked layout read back plainly: [Npad, G, H] bytes, [NB, G, 16] scales (fp32, or fp16 bits as
    int16) → [N, K] fp32."""
    Npad, G, H = data.shape
    d = data.reshape(Npad // ROWS, G, H // 4, ROWS, 4).permute(0, 3, 1, 2, 4).reshape(Npad, G * H).long()
    q = torch.stack((d & 0xF, d >> 4), -1).reshape(Npad, G, group) - 8  # [Npad, G, group]
    s = (scale.view(torch.float16).float() if scale.dtype == torch.int16 else scale).permute(0, 2, 1).reshape(Npad, G)
    return (q.float() * s[..., None]).reshape(Npad, G * group)[:N]


@pytest.mark.parametrize("kind", list(Scales))
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("N", [1, 17, 32])
def test_repacked_layout_holds_the_weights(group, N, kind):
    """FP16 and FP32: one kind of scales [NB, G, 16]; BOTH: the fp16 bits of the NB blocks, then their fp32
    scales as int16 pairs ([3·NB, G, 16] int16), each of the two reading back the weights."""
    g = torch.Generator().manual_seed(N + group)
    w = quantize_int4(torch.randn(N, 3 * group, generator=g), group)
    data, scale = repack(w, kind)
    NB = -(-N // ROWS)
    assert data.shape == (NB * ROWS, 3, group // 2) and scale.shape == (NB * (3 if kind == Scales.BOTH else 1), 3, ROWS)
    assert scale.dtype == (torch.float32 if kind == Scales.FP32 else torch.int16)
    halves = [scale] if kind != Scales.BOTH else [scale[:NB], scale[NB:].reshape(NB, 3, 2 * ROWS).view(torch.float32)]
    for s in halves:  # fp16 bits, or fp32
        fp16 = s.dtype == torch.int16
        copy = PackedWeight(w.data, w.scale.half().float() if fp16 else w.scale, WeightFormat.INT4, group)
        assert torch.equal(_unpack_repacked(data, s, N, group), dequantize(copy))
        s = s.view(torch.float16) if fp16 else s
        assert (s.permute(0, 2, 1).reshape(-1, 3)[N:] == 0).all()  # padded rows: nothing


def test_scales_follow_the_switches(monkeypatch):
    from moetune.kernels.cpu.q4r import scale_fp16, scales

    assert (runtime.Q4_X_PARTS_FEW, runtime.Q4_X_PARTS, scales()) == (2, 3, Scales.BOTH)  # the default
    assert scale_fp16(16) and not scale_fp16(17)
    monkeypatch.setattr(runtime, "Q4_SCALE_FP16_FEW", False)
    assert scales() == Scales.FP32 and not scale_fp16(1)
    monkeypatch.setattr(runtime, "Q4_SCALE_FP16", True)
    with pytest.raises(ValueError, match="not a mode"):
        scales()


@pytest.mark.parametrize("n_parts", [1, 2, 3])
@pytest.mark.parametrize("group", [32, 128])
def test_x_parts_hold_x_within_their_step(group, n_parts):
    """x ≈ xd·Σ_p xq_p·254⁻ᵖ within half a step of the last part (absmax / (2·`x_levels`)), each part in int8."""
    g = torch.Generator().manual_seed(group + n_parts)
    x = torch.randn(5, 3 * group, generator=g) * torch.logspace(-3, 2, 5)[:, None]
    x[0, :group] = 0  # an all-zero group
    xq, xd = quantize_x_ref(x, group, n_parts)  # [M, P, K], [M, G]
    assert xq.dtype == torch.int8 and xq.shape == (5, n_parts, 3 * group) and (xq.abs() <= 127).all()
    back = (xq.double() * (254.0 ** -torch.arange(n_parts, dtype=torch.float64))[None, :, None]).sum(1)
    back = back.view(5, 3, group) * xd.double()[..., None]  # [M, G, group]
    top = x.view(5, 3, group).abs().amax(-1, keepdim=True).double()
    err = (back - x.view(5, 3, group).double()).abs()
    assert (err <= top / (2 * x_levels(n_parts)) * (1 + 1e-3) + top * 2.0 ** -23).all()
    assert (back[0, 0] == 0).all()


def test_x_order_is_the_byte_order():
    """Position j of the kernels' x row holds the column whose weight sits in the nibble it multiplies."""
    order = x_order(64, 32)
    assert order[:8].tolist() == [0, 2, 4, 6, 1, 3, 5, 7] and order[32:40].tolist() == [32, 34, 36, 38, 33, 35, 37, 39]
    assert sorted(order.tolist()) == list(range(64))


def _close(got: torch.Tensor, x: torch.Tensor, w: PackedWeight) -> None:
    """got equals the integer twin but for an x element rounding the other way (one step of x on the
    row's largest weight, plus fp32 rounding), and `linear_ref` within `q8_bound`."""
    _, xd = quantize_x_ref(x, w.group_size)  # [M, G]
    xs = xd * 127 / x_levels(x_parts(x.shape[0]))  # the last part's step
    step = xs.amax(dim=1)[:, None] * dequantize(w).abs().amax(dim=1)[None, :]  # [M, N]
    want = linear_q4r_ref(x, w)
    assert ((got - want).abs() <= step + 1e-5 * want.abs().amax() + 1e-30).all()
    ref = linear_ref(x, w)
    assert ((got - ref).abs() <= q8_bound(x, w) * (1 + 1e-4) + 2e-6 * ref.abs().amax()).all()


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("N", [1, 15, 17, 37])
@pytest.mark.parametrize("M", [1, 3, 4, 5, 16, 17, 70])
def test_linear_matches_its_twins(group, N, M, threads, parts):
    g = torch.Generator().manual_seed(M * 131 + N * 7 + group)
    w = quantize_int4(torch.randn(N, 3 * group, generator=g), group)
    x = torch.randn(M, 3 * group, generator=g) * 2
    got = linear(x, w, threads=threads)
    assert got.shape == (M, N)
    _close(got, x, w)


def test_linear_rows_do_not_depend_on_their_neighbours():
    """Row m of a call equals the same row alone (every tile computes a row the same way)."""
    g = torch.Generator().manual_seed(5)
    w = quantize_int4(torch.randn(48, 256, generator=g), 32)
    x = torch.randn(7, 256, generator=g)
    whole = linear(x, w, threads=1)
    for m in range(7):
        assert torch.equal(linear(x[m:m + 1], w, threads=1), whole[m:m + 1])


def experts_twin(x, off, w13: PackedWeight, w2: PackedWeight) -> torch.Tensor:
    """Each expert through `linear_q4r_ref` twice (x, then its activation, each in the parts its rows take)."""
    I = w2.data.shape[2] * 2
    y = torch.zeros_like(x)
    for e in range(w13.data.shape[0]):
        lo, hi = int(off[e]), int(off[e + 1])
        if hi == lo:
            continue
        h = linear_q4r_ref(x[lo:hi], PackedWeight(w13.data[e], w13.scale[e], WeightFormat.INT4, w13.group_size))
        a = F.silu(h[:, :I]) * h[:, I:]  # [rows, I]
        y[lo:hi] = linear_q4r_ref(a, PackedWeight(w2.data[e], w2.scale[e], WeightFormat.INT4, w2.group_size))
    return y


@pytest.mark.parametrize("rows", [[1, 1], [1, 0, 3, 1, 0], [2, 1, 1, 5, 1, 1, 1], [16, 0, 17], [37, 0, 70]])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_experts_match_their_twins(rows, group, threads, parts):
    g = torch.Generator().manual_seed(len(rows) + group + sum(rows))
    E, D, I = len(rows), 384, 2 * group if group < 128 else 128
    w13 = quantize_int4(torch.randn(E, 2 * I, D, generator=g), group)
    w2 = quantize_int4(torch.randn(E, D, I, generator=g), group)
    off = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
    x = torch.randn(int(off[-1]), D, generator=g)
    got = fused_experts_cpu(x, off, w13, w2, threads=threads)
    want = experts_twin(x, off, w13, w2)
    assert ((got - want).norm() / want.norm()).item() < 5e-5  # the activation: fp32 sums, then flips of its rounding
    ref = fused_experts_cpu_ref(x, off, w13, w2)  # fp32: x and the activation each rounded to 8 bits, or 16, 24,
    fp16 = parts[2] and min(r for r in rows if r) <= 16 or parts[3]  # and the scales to fp16 (≤ 2⁻¹¹ each)
    assert ((got - ref).norm() / ref.norm()).item() < (3e-2 if 1 in parts[:2] else 1e-3 if fp16 else 1e-4)


@pytest.mark.parametrize("rows", [[1], [0, 1, 0], [1, 1], [1, 0, 1, 1], [1, 1, 1, 0, 1, 1, 1]])
@pytest.mark.parametrize("blocks", [1, 22, 37])
def test_one_row_an_expert_goes_expert_by_expert_to_the_same_bits(rows, blocks, monkeypatch):
    """One x row for every active expert (decode of one sequence): the parallel kernel's items go expert
    by expert in runs of gate blocks then up blocks (`_jit_q4r._up_run`); each output lane sums what the
    serial twin sums, in its order: equal bits, for 2, 22 and 38 blocks of 16 activation columns (I a
    multiple of the group: runs of up to 16, fewer when the experts are few, the last one ragged) and any
    number of active experts."""
    monkeypatch.setattr(runtime, "SERIAL_BYTES", 0)
    g = torch.Generator().manual_seed(blocks + len(rows))
    E, D, I = len(rows), 96, 16 * blocks if blocks % 2 == 0 else 16 * (blocks + 1)
    w13 = quantize_int4(torch.randn(E, 2 * I, D, generator=g), 32)
    w2 = quantize_int4(torch.randn(E, D, I, generator=g), 32)
    off = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
    x = torch.randn(int(off[-1]), D, generator=g)
    got = fused_experts_cpu(x, off, w13, w2, threads=2)
    assert torch.equal(got, fused_experts_cpu(x, off, w13, w2, threads=1))
    want = experts_twin(x, off, w13, w2)
    assert ((got - want).norm() / want.norm()).item() < 5e-5


def test_a_weight_written_in_place_is_repacked_again():
    """An offloading store copies experts into its slot tensors: the cached repack follows the bytes."""
    g = torch.Generator().manual_seed(9)
    w = quantize_int4(torch.randn(2, 32, 64, generator=g), 32)
    x = torch.randn(1, 64, generator=g)
    one = PackedWeight(w.data[0], w.scale[0], WeightFormat.INT4, 32)
    before = linear(x, one, threads=1)
    other = quantize_int4(torch.randn(32, 64, generator=g), 32)
    one.data.copy_(other.data)
    one.scale.copy_(other.scale)
    got = linear(x, one, threads=1)
    assert not torch.equal(got, before)
    _close(got, x, other)


def test_slots_are_repacked_once_per_write(monkeypatch):
    """An offloading cache's slots count their writes (`PackedWeight.generation`), which torch's version
    counter misses (it writes them with preadv, or under inference mode): the repack cache follows the
    counts, slot by slot — a slot written is repacked once, the others not at all."""
    from moetune.kernels.cpu import q4r

    g = torch.Generator().manual_seed(11)
    with torch.inference_mode():  # as the slots of an engine's cache: no version counter
        w = quantize_int4(torch.randn(3, 64, 64, generator=g), 32)  # w13 of 3 experts: 2I = 64, D = 64
        data, scale = w.data.clone(), w.scale.clone()
    written = torch.zeros(3, dtype=torch.int64)
    slots = PackedWeight(data, scale, WeightFormat.INT4, 32, generation=written)
    calls = []
    real = q4r.repack
    monkeypatch.setattr(q4r, "repack", lambda v, kind=Scales.FP32: calls.append(v.data.dim()) or real(v, kind))
    first = [t.clone() for t in q4r.repacked(slots)]
    assert calls == [3]  # the whole weight, once
    assert all(torch.equal(a, b) for a, b in zip(q4r.repacked(slots), first)) and calls == [3]  # nothing written
    other = quantize_int4(torch.randn(64, 64, generator=g), 32)
    with torch.inference_mode():
        data[1].copy_(other.data)
        scale[1].copy_(other.scale)
    written[1] += 1
    got = q4r.repacked(slots)
    assert calls == [3, 2]  # slot 1 alone
    fresh = real(PackedWeight(data, scale, WeightFormat.INT4, 32), q4r.scales())
    assert all(torch.equal(a, b) for a, b in zip(got, fresh))  # the copy holds the new bytes
    assert not torch.equal(got[0][1], first[0][1]) and torch.equal(got[0][0], first[0][0])
    q4r.repacked(slots)
    assert calls == [3, 2]  # once per write
    w2 = quantize_int4(torch.randn(3, 64, 32, generator=g), 32)
    x, off = torch.randn(3, 64, generator=g), torch.tensor([0, 1, 3, 3])
    plain = PackedWeight(data.clone(), scale.clone(), WeightFormat.INT4, 32)
    assert torch.equal(fused_experts_cpu(x, off, slots, w2, threads=1), fused_experts_cpu(x, off, plain, w2, threads=1))
