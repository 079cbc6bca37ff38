"""The integer tiles of `kernels/cpu/_simd.py` (LLVM vector IR: pmaddwd / vpdpwssd) behind the
int8 linear for 1-16 x rows (`runtime.Q8_ROWS`) and the int4 linear and experts (`runtime.Q4_ROWS`):
each equals its twin (x rounded per block as the kernel rounds it, exact integer sums:
`linear_q8_ref`, `linear_q4_ref`) to one rounding step of x, and the dequantised fp32 reference
within the stated bound `q8_bound` (Σ_b xs_b/2 · Σ_{k in b} |W[n, k]|, xs_b = absmax(x block) / 32767),
on M = 1…16, odd N and K, int4 groups 32 / 64 / 128; a row cut at block edges (a tensor-parallel
rank's slice) rounds x as the whole row does. Each instruction-set variant (AVX2, generic, ...)
against the twins: test_cpu_isa.py. These are the int16 int4 kernels (`runtime.Q4_INTERLEAVED` off, the
documented option); the default interleaved int4 kernels (int8 x): test_cpu_q4r.py."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from moetune.kernels.cpu import (fused_experts_cpu, fused_experts_cpu_ref, linear, linear_ref,  # noqa: E402
                                 quantize_int4, quantize_int8)
from moetune.kernels.cpu import runtime  # noqa: E402
from moetune.kernels.cpu.formats import dequantize  # noqa: E402
from moetune.kernels.cpu.linear import (linear_q4_ref, linear_q8_ref, q8_bound, quantize_rows_ref,  # noqa: E402
                                        x_block, x_block_aligned)
from moetune.kernels.quant_formats import PackedWeight, WeightFormat  # noqa: E402
from tests.kernels.test_cpu_kernels import threads  # noqa: E402,F401  (the fixture: serial and parallel)

ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 16]


@pytest.fixture(autouse=True)
def int16_int4(monkeypatch):
    monkeypatch.setattr(runtime, "Q4_INTERLEAVED", False)


@pytest.fixture
def integer_paths(monkeypatch):
    monkeypatch.setattr(runtime, "Q8_ROWS", 16)
    monkeypatch.setattr(runtime, "Q4_ROWS", 16)


def _close(got: torch.Tensor, x: torch.Tensor, w: PackedWeight) -> None:
    """got equals the integer twin but for an x element rounding the other way (one step of x on
    the largest weight of the row, plus fp32 rounding), and `linear_ref` within `q8_bound`."""
    int4 = w.fmt == WeightFormat.INT4
    _, xs = quantize_rows_ref(x, x_block(w))  # [M, blocks]
    step = xs.amax(dim=1)[:, None] * dequantize(w).abs().amax(dim=1)[None, :]  # [M, N]
    want = linear_q4_ref(x, w) if int4 else linear_q8_ref(x, w)
    assert ((got - want).abs() <= step + 1e-5 * want.abs().amax() + 1e-30).all()
    ref = linear_ref(x, w)
    assert ((got - ref).abs() <= q8_bound(x, w) * (1 + 1e-4) + 1e-6 * ref.abs().amax()).all()


@pytest.mark.parametrize("M", ROWS)
@pytest.mark.parametrize("N,K", [(1, 7), (47, 95), (33, 768), (9, 4099)])
def test_int8_rows_match_their_twins(M, N, K, threads, integer_paths):
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    w = quantize_int8(torch.randn(N, K, generator=g))
    x = torch.randn(M, K, generator=g) * 3
    _close(linear(x, w, threads=threads), x, w)


@pytest.mark.parametrize("M", ROWS)
@pytest.mark.parametrize("N,K,group", [(1, 32, 32), (47, 96, 32), (13, 192, 64), (33, 768, 128), (5, 640, 64)])
def test_int4_rows_match_their_twins(M, N, K, group, threads, integer_paths):
    g = torch.Generator().manual_seed(M * 1000 + N + K + group)
    w = quantize_int4(torch.randn(N, K, generator=g), group)
    x = torch.randn(M, K, generator=g) * 3
    _close(linear(x, w, threads=threads), x, w)


def test_extremes_and_zero_rows(integer_paths):
    """Every nibble at 0 or 15 and every x at ±absmax (the largest group sums), and all-zero x rows."""
    for group in (32, 64, 128):
        w = quantize_int4(torch.tensor([[-8.0] * 128 + [7.0] * 128] * 3), group)
        x = torch.full((2, 256), 5.0)
        x[1, ::2] = -5.0
        torch.testing.assert_close(linear(x, w), linear_ref(x, w), rtol=1e-5, atol=1e-3)
        assert torch.equal(linear(torch.zeros(3, 256), w), torch.zeros(3, 3))
    w8 = quantize_int8(torch.randn(5, 4099))
    assert torch.equal(linear(torch.zeros(4, 4099), w8), torch.zeros(4, 5))


@pytest.mark.parametrize("fmt", ["int8", "int4-g32", "int4-g64"])
@pytest.mark.parametrize("M", [1, 5, 16])
def test_a_row_cut_at_block_edges_rounds_x_as_the_whole_row(fmt, M, integer_paths):
    """A rank of a row-parallel layer holds whole x blocks of the row (`x_block_aligned`): each
    slice's integer result summed over the slices equals the whole row's to fp32 rounding, and the
    slices' rounding of x is the whole row's, element for element."""
    g = torch.Generator().manual_seed(M)
    N, K, parts = 19, 256, 4
    W = torch.randn(N, K, generator=g)
    w = quantize_int8(W) if fmt == "int8" else quantize_int4(W, int(fmt.split("g")[1]))
    x = torch.randn(M, K, generator=g) * torch.logspace(-2, 1, K)  # blocks of very different scales
    cut = K // parts
    assert x_block_aligned(cut, w) and not x_block_aligned(cut + 16, w)
    per_byte = 2 if w.fmt == WeightFormat.INT4 else 1
    total = torch.zeros(M, N)
    for p in range(parts):
        cols = slice(p * cut // per_byte, (p + 1) * cut // per_byte)
        groups = slice(p * cut // w.group_size, (p + 1) * cut // w.group_size) if per_byte == 2 else slice(None)
        part = PackedWeight(w.data[:, cols].contiguous(), w.scale[:, groups].contiguous() if per_byte == 2
                            else w.scale, w.fmt, w.group_size)
        xp = x[:, p * cut:(p + 1) * cut].contiguous()
        assert torch.equal(quantize_rows_ref(xp, x_block(w))[0],
                           quantize_rows_ref(x, x_block(w))[0][:, p * cut:(p + 1) * cut])
        total += linear(xp, part)
    whole = linear(x, w)
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-5 * whole.abs().max().item())


def _experts_twin(x, off, w13: PackedWeight, w2: PackedWeight, rows: int) -> torch.Tensor:
    """Experts of ≤ rows rows as the integer path computes them (x and the activation rounded per
    group, `linear_q4_ref`), the others as the fp32 twin."""
    y = fused_experts_cpu_ref(x, off, w13, w2)
    I = 2 * w2.data.shape[2]
    for e in range(off.numel() - 1):
        lo, hi = int(off[e]), int(off[e + 1])
        if not 0 < hi - lo <= rows:
            continue
        h = linear_q4_ref(x[lo:hi], PackedWeight(w13.data[e], w13.scale[e], WeightFormat.INT4, w13.group_size))
        a = F.silu(h[:, :I]) * h[:, I:]  # [rows, I]
        y[lo:hi] = linear_q4_ref(a, PackedWeight(w2.data[e], w2.scale[e], WeightFormat.INT4, w2.group_size))
    return y


@pytest.mark.parametrize("rows", [[1, 1], [1, 0, 3, 1, 0], [2, 1, 1, 5, 1, 1, 1]])
@pytest.mark.parametrize("group,limit", [(32, 1), (64, 4), (128, 16)])
def test_int4_experts_match_their_twin(rows, group, limit, threads, monkeypatch):
    monkeypatch.setattr(runtime, "Q4_ROWS", limit)
    g = torch.Generator().manual_seed(len(rows) + group)
    E, D, I = len(rows), 384, 128
    w13 = quantize_int4(torch.randn(E, 2 * I, D, generator=g), group)
    w2 = quantize_int4(torch.randn(E, D, I, generator=g), group)
    off = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
    x = torch.randn(int(off[-1]), D, generator=g)
    got = fused_experts_cpu(x, off, w13, w2, threads=threads)
    want = _experts_twin(x, off, w13, w2, limit)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    ref = fused_experts_cpu_ref(x, off, w13, w2)  # rounding x and the activation to int16 costs < 1e-4
    assert ((got - ref).norm() / ref.norm()).item() < 1e-4
