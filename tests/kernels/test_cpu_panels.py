"""`kernels/cpu/panels.py`: many-row matmuls of packed weights, panel by panel, against the whole-weight twin."""

import pytest
import torch

from moetune.kernels.cpu import panels
from moetune.kernels.cpu.formats import quantize_int4, quantize_int8
from moetune.kernels.cpu.formats import dequantize
from moetune.kernels.cpu.panels import int8_mm_t, packed_linear, packed_linear_ref, packed_mm_t


def _weight(fmt: str, N: int, K: int, seed: int = 0):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    return quantize_int8(w) if fmt == "int8" else quantize_int4(w, 32)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("N,K,M", [(37, 64, 3), (300, 96, 129), (1, 32, 70), (515, 160, 17)])
def test_panels_match_the_whole_weight(monkeypatch, fmt, N, K, M):
    monkeypatch.setattr(panels, "PANEL_BYTES", 16 * 4 * K + 4)  # 16-row panels: several, and a ragged last one
    monkeypatch.setattr(panels, "int8_integer_at_prefill", lambda: False)  # widened panels (the integer way: below)
    w = _weight(fmt, N, K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(N)
    ref = packed_linear_ref(x, w, bias)  # [M, N]
    got = packed_linear(x, w, bias)
    assert got.shape == (M, N) and got.is_contiguous()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert panels.panel_rows(K) == 16


def test_transposed_input_and_output_buffer():
    w = _weight("int8", 200, 128)
    x = torch.randn(128, 45).t()  # [45, 128], a transposed view
    out = torch.full((200, 45), float("nan"))
    yT = packed_mm_t(w, x, out=out)  # [N, M]
    assert yT.data_ptr() == out.data_ptr()
    torch.testing.assert_close(yT.t(), packed_linear_ref(x, w), rtol=1e-5, atol=1e-5)


def test_takes_only_fp32_cpu_rows_and_packed_weights():
    w = _weight("int8", 32, 64)
    assert panels.takes(torch.zeros(2, 64), w)
    assert not panels.takes(torch.zeros(2, 64, dtype=torch.bfloat16), w)
    assert not panels.takes(torch.zeros(2, 64), torch.zeros(32, 64))


@pytest.mark.parametrize("N,K,M", [(37, 64, 3), (300, 96, 129), (1, 32, 70), (515, 17, 16), (33, 160, 1)])
@pytest.mark.parametrize("transposed", [False, True])
def test_integer_way_within_its_bound(monkeypatch, N, K, M, transposed):
    """int8 weights through torch's integer GEMM (x per row in X_PARTS int8 parts): within the parts'
    rounding, d·0.5·254^-(P-1) per element of x, of the fp32 product, on ragged panels, an outlier channel
    and a transposed x."""
    monkeypatch.setattr(panels, "PANEL_BYTES", 16 * 4 * panels.X_PARTS * M + 4)  # 16-row panels
    w = _weight("int8", N, K, seed=2)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(4))
    x[:, K // 3] *= 40.0  # an outlier channel: the row's scale is its
    if transposed:
        x = x.t().contiguous().t()
    got = int8_mm_t(w, x).t()  # [M, N]
    ref = x.double() @ dequantize(w).double().t()  # [M, N]
    d = x.abs().amax(1, keepdim=True).double() / 127  # [M, 1]
    bound = d * 0.5 * 254.0 ** -(panels.X_PARTS - 1) @ dequantize(w).double().abs().sum(1, keepdim=True).t()
    assert ((got.double() - ref).abs() <= bound + 1e-5 * ref.abs() + 1e-6).all()
    assert torch.equal(got, int8_mm_t(w, x.contiguous()).t())  # strides do not change the result


def test_packed_mm_t_takes_the_integer_way_where_chosen(monkeypatch):
    w, x = _weight("int8", 40, 64), torch.randn(20, 64)
    monkeypatch.setattr(panels, "int8_integer_at_prefill", lambda: True)
    assert torch.equal(packed_mm_t(w, x), int8_mm_t(w, x))
