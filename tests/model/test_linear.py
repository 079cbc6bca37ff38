"""Projections on the CPU decode kernel (small M) against F.linear; fused QKV; the loader's choice."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from moetune.model.linear import Linear, project  # noqa: E402
from moetune.model.loader import load_model  # noqa: E402
from moetune.model.mlp import GatedMLP  # noqa: E402


@pytest.mark.parametrize("M", [0, 1, 3, 16, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_project_matches_f_linear(M, bias):
    g = torch.Generator().manual_seed(M)
    w, x = torch.randn(37, 29, generator=g), torch.randn(M, 29, generator=g)
    b = torch.randn(37, generator=g) if bias else None
    torch.testing.assert_close(project(x, w, b, small_m=16), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_fused_projection_is_its_parts_side_by_side():
    g = torch.Generator().manual_seed(0)
    parts = [Linear(torch.randn(n, 24, generator=g), torch.randn(n, generator=g) if n == 8 else None) for n in (16, 8, 8)]
    fused = Linear.fused(parts, small_m=16)
    x = torch.randn(3, 24, generator=g)
    want = torch.cat([F.linear(x, p.weight, p.bias) for p in parts], dim=-1)
    torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-5)
    assert Linear.fused(parts[1:2]).bias is not None and Linear.fused([parts[0]]).bias is None


def test_gated_mlp_kernel_path_matches_torch():
    g = torch.Generator().manual_seed(0)
    gate, up, down = torch.randn(19, 12, generator=g), torch.randn(19, 12, generator=g), torch.randn(12, 19, generator=g)
    x = torch.randn(5, 12, generator=g)
    torch.testing.assert_close(GatedMLP(gate, up, down, small_m=16)(x), GatedMLP(gate, up, down)(x),
                               rtol=1e-5, atol=1e-5)


def test_loader_turns_the_kernels_on_for_fp32_cpu_only(checkpoint):
    path = checkpoint("qwen3_moe")
    assert load_model(path).small_m == 16
    assert load_model(path, kernel_backend="torch").small_m == 0
    assert load_model(path, dtype=torch.bfloat16).small_m == 0
    assert all(layer.attention.decode_kernel for layer in load_model(path).layers)  # paged decode kernel on
    assert not any(layer.attention.decode_kernel for layer in load_model(path, kernel_backend="torch").layers)
    from moetune.kernels.cpu import runtime

    assert runtime.jit().linear_dense.signatures and runtime.jit().experts_dense.signatures  # warmed at load


@pytest.mark.parametrize("M,kernel", [(16, True), (17, False), (40, False)])
def test_a_large_weight_stays_on_the_kernel_up_to_64_rows(M, kernel, monkeypatch):
    """Which path runs: a small weight above 16 rows takes F.linear; a weight of 8 MB or more (here
    the threshold is lowered to this weight's size) takes the kernel up to 64 rows; results match."""
    from moetune.model import linear as lin

    calls = []
    monkeypatch.setattr(lin, "cpu_linear", lambda x, w: calls.append(x.shape[0]) or x @ w.t())
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(37, 29, generator=g), torch.randn(M, 29, generator=g)
    torch.testing.assert_close(project(x, w, small_m=16), F.linear(x, w))
    assert bool(calls) == kernel
    monkeypatch.setattr(lin, "LARGE_WEIGHT_BYTES", w.numel() * 4)
    calls.clear()
    project(x, w, small_m=16)
    assert calls == [M]
    calls.clear()
    project(torch.randn(65, 29), w, small_m=16)  # above 64 rows: F.linear again
    project(x, w, small_m=0)  # the kernel off: F.linear always
    assert calls == []


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("vnni", [True, False])
def test_a_packed_weight_past_64_rows_takes_the_panels(monkeypatch, fmt, vnni):
    """Packed weights beyond LARGE_WEIGHT_M rows with the kernels on: torch's GEMM on panels (`panels.py`),
    within fp32 (int8 with VNNI: within its x parts' rounding) of the whole-weight twin, bias included;
    int4 stays on the interleaved kernel only with VNNI."""
    from moetune.kernels.cpu import panels
    from moetune.kernels.cpu import quantize_int4, quantize_int8
    from moetune.kernels.cpu.panels import packed_linear_ref
    from moetune.model import linear

    monkeypatch.setattr(panels, "int4_kernel_at_prefill", lambda: vnni)
    monkeypatch.setattr(panels, "int8_integer_at_prefill", lambda: vnni)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(96, 64, generator=g)
    w = quantize_int8(w) if fmt == "int8" else quantize_int4(w, 32)
    x, b = torch.randn(linear.LARGE_WEIGHT_M + 7, 64, generator=g), torch.randn(96, generator=g)
    calls = []
    monkeypatch.setattr(panels, "packed_linear", lambda *a: calls.append(1) or packed_linear_ref(*a))
    got = project(x, w, b, small_m=16)
    assert calls == ([] if fmt == "int4" and vnni else [1])
    torch.testing.assert_close(got, packed_linear_ref(x, w, b), rtol=1e-3, atol=1e-3)
    calls.clear()
    project(x, w, b, small_m=0)  # the kernels off: the whole-weight twin
    assert calls == []
