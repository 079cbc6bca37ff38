"""Device checks: the kernels on CUDA in bf16 against their twins, and a quick benchmark run.

bf16 tolerance: atol = rtol = 3e-2 (tensor-core bf16 products, intermediate rounded to bf16).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_moe_kernels.py"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_bench_says_one_line_without_cuda():
    run = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True)
    assert run.returncode != 0 and run.stdout == ""
    assert run.stderr.strip() == "bench_moe_kernels needs a CUDA device; none found"


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("fmt", ["NONE", "INT8", "INT4", "FP8"])
def test_fused_experts_on_cuda(fmt):
    from moetune.kernels.align import align_block_size
    from moetune.kernels.quant_formats import WeightFormat, quantize
    from moetune.kernels.reference import align_block_size_ref, fused_experts_ref
    from moetune.kernels.fused_experts import fused_experts

    E, K, D, I, T = 10, 4, 256, 384, 300
    g = dict(device="cuda")
    x = torch.randn(T, D, **g).bfloat16()
    w13, w2 = torch.randn(E, 2 * I, D, **g) / 16, torch.randn(E, D, I, **g) / 20
    ids = torch.rand(T, E, **g).topk(K, dim=1).indices
    layout = align_block_size(ids, E, 32)
    ref_layout = align_block_size_ref(ids, E, 32)
    assert all(torch.equal(a, b) for a, b in zip(layout[:6], ref_layout[:6]))
    f = WeightFormat[fmt]
    p13 = quantize(w13.bfloat16() if f == WeightFormat.NONE else w13, f, 128)
    p2 = quantize(w2.bfloat16() if f == WeightFormat.NONE else w2, f, 128)
    weights = torch.rand(T, K, **g)
    out = fused_experts(x, p13, p2, layout, weights)
    torch.testing.assert_close(out.float(), fused_experts_ref(x, p13, p2, layout, weights).float(),
                               atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@cuda
def test_router_on_cuda():
    from moetune.kernels.reference import select_experts_ref
    from moetune.kernels.router import select_experts
    from moetune.spec import RouterSpec

    spec = RouterSpec("sigmoid", 8, True, 8, 4, True, 2.5)
    logits, bias = torch.randn(257, 256, device="cuda"), torch.rand(256, device="cuda") * 0.1
    w, ids = select_experts(logits, spec, bias)
    rw, rids = select_experts_ref(logits, spec, bias)
    assert (ids.sort(1).values == rids.sort(1).values).float().mean() > 0.999
    torch.testing.assert_close(w.sort(1).values, rw.sort(1).values, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@cuda
def test_bench_quick_runs():
    run = subprocess.run([sys.executable, str(BENCH), "--quick", "--batch-sizes", "1", "64"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "mixtral-quick" in run.stdout and "deepseek-quick" in run.stdout
