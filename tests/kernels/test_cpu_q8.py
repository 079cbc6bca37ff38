"""The integer path of int8 weights against one x row (`kernels/cpu/_jit_q8.py`): equal to its twin
(x rounded the same way, exact integer sums), within its stated bound of the dequantised fp32
reference, never overflowing, on awkward shapes, in the linear kernel and the experts (the other
instruction sets' code: test_cpu_isa.py)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from moetune.kernels.cpu import fused_experts_cpu, fused_experts_cpu_ref, linear, linear_ref, quantize_int8  # noqa: E402
from moetune.kernels.cpu import runtime  # noqa: E402
from moetune.kernels.cpu.formats import dequantize  # noqa: E402
from moetune.kernels.cpu.linear import linear_q8_ref, q8_bound, quantize_rows_ref  # noqa: E402
from moetune.kernels.quant_formats import PackedWeight, WeightFormat  # noqa: E402
from tests.kernels.test_cpu_kernels import threads  # noqa: E402,F401  (the fixture: serial and parallel)


def _twin_close(got: torch.Tensor, x: torch.Tensor, w: PackedWeight) -> None:
    """got equals the integer twin to fp32 rounding (a product of three fp32 factors, and an x
    element that rounds the other way on a tie: one step of x times the largest weight), and
    `linear_ref` within the stated bound."""
    _, xs = quantize_rows_ref(x)  # [M, blocks]
    step = xs.amax(dim=1)[:, None] * dequantize(w).abs().amax(dim=1)[None, :]  # [M, N] one step of x on the largest weight
    want = linear_q8_ref(x, w)
    assert ((got - want).abs() <= step + 1e-6 * want.abs() + 1e-30).all()
    ref = linear_ref(x, w)
    assert ((got - ref).abs() <= q8_bound(x, w) * (1 + 1e-4) + 1e-6 * ref.abs().max()).all()


@pytest.mark.parametrize("K", [1, 7, 95, 516, 517, 768, 4099])
@pytest.mark.parametrize("N", [1, 5, 47])
def test_linear_one_row_matches_its_twins(K, N, threads):
    g = torch.Generator().manual_seed(K * 100 + N)
    w = quantize_int8(torch.randn(N, K, generator=g))
    x = torch.randn(1, K, generator=g)
    _twin_close(linear(x, w, threads=threads), x, w)


def test_the_worst_case_sum_does_not_overflow(threads):
    """Every weight at +127 and every x element at its largest: the int32 sum is K·qmax·127."""
    for K in (516, 4099, 20000):
        w = quantize_int8(torch.ones(3, K))  # data 127, scale 1/127
        x = torch.full((1, K), 3.0)
        x[0, ::2] = -3.0 if K % 2 == 0 else 3.0
        got = linear(x, w, threads=threads)
        torch.testing.assert_close(got, linear_ref(x, w), rtol=1e-5, atol=0)


def test_a_zero_row_and_the_switch_off(monkeypatch):
    g = torch.Generator().manual_seed(0)
    w = quantize_int8(torch.randn(33, 95, generator=g))
    assert torch.equal(linear(torch.zeros(1, 95), w), torch.zeros(1, 33))
    x = torch.randn(1, 95, generator=g)
    on = linear(x, w)
    monkeypatch.setattr(runtime, "INT8_ROW", False)
    off = linear(x, w)  # the fp32 path
    torch.testing.assert_close(off, linear_ref(x, w), rtol=1e-5, atol=1e-5)
    assert not torch.equal(on, off) and ((on - off).abs() <= q8_bound(x, w) * 1.001 + 1e-5).all()
    assert linear(torch.randn(2, 95), w).shape == (2, 33)


def _experts_q8_twin(x, off, w13: PackedWeight, w2: PackedWeight) -> torch.Tensor:
    """One-row experts as the integer path computes them (x and the activation rounded per block),
    experts with more rows as the fp32 twin."""
    y = fused_experts_cpu_ref(x, off, w13, w2)
    I = w2.data.shape[2]
    for e in range(off.numel() - 1):
        lo, hi = int(off[e]), int(off[e + 1])
        if hi - lo != 1:
            continue
        h = linear_q8_ref(x[lo:hi], PackedWeight(w13.data[e], w13.scale[e], WeightFormat.INT8))  # [1, 2I]
        a = F.silu(h[:, :I]) * h[:, I:]  # [1, I]
        y[lo:hi] = linear_q8_ref(a, PackedWeight(w2.data[e], w2.scale[e], WeightFormat.INT8))
    return y


@pytest.mark.parametrize("schedule", ["split", "whole"])
@pytest.mark.parametrize("rows", [[1, 1], [1, 0, 3, 1, 0], [2, 1, 1, 5, 1, 1, 1]])
def test_one_row_int8_experts_match_their_twin(schedule, rows, threads, monkeypatch):
    from moetune.kernels.cpu import experts as experts_module

    monkeypatch.setattr(experts_module, "SCHEDULE", schedule)
    g = torch.Generator().manual_seed(len(rows))
    E, D, I = len(rows), 95, 37
    w13, w2 = quantize_int8(torch.randn(E, 2 * I, D, generator=g)), quantize_int8(torch.randn(E, D, I, generator=g))
    off = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
    x = torch.randn(int(off[-1]), D, generator=g)
    got = fused_experts_cpu(x, off, w13, w2, threads=threads)
    want = _experts_q8_twin(x, off, w13, w2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    ref = fused_experts_cpu_ref(x, off, w13, w2)  # and near the fp32 twin: rounding x costs < 1e-3
    assert ((got - ref).norm() / ref.norm()).item() < 1e-3
