"""Grouped-GEMM kernel vs its twin (dequantise, loop over experts), per weight format.

Tolerances (the twin dequantises the same packed values, so only summation order differs):
fp32 activations: atol = rtol = 1e-5 (D, I ≤ 128, |out| ≲ 5); bf16/fp16 activations: the
intermediate is rounded to the activation dtype in both, one-ulp flips allowed → atol = rtol = 2e-2.
"""

import pytest
import torch

from moetune.kernels.align import align_block_size
from moetune.kernels.configs import GemmConfig
from moetune.kernels.fused_experts import fused_experts
from moetune.kernels.quant_formats import WeightFormat, quantize
from moetune.kernels.reference import fused_experts_ref
from tests.kernels.helpers import all_to_one, random_topk_ids

CFG = GemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=1)
FP32_TOL = dict(atol=1e-5, rtol=1e-5)


def _problem(T, E, K, D, I, seed=0, dtype=torch.float32, topk_ids=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(dtype)  # [T, D]
    w13 = torch.randn(E, 2 * I, D, generator=g) / D ** 0.5  # [E, 2I, D]
    w2 = torch.randn(E, D, I, generator=g) / I ** 0.5  # [E, D, I]
    ids = random_topk_ids(T, E, K, seed=seed, avoid=1) if topk_ids is None else topk_ids  # expert 1 empty
    weights = torch.rand(T, K, generator=g)  # [T, K]
    return x, w13, w2, ids, weights


def _poisoned(shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


def _run_both(x, p13, p2, layout, weights, **kw):
    T, D = x.shape
    rows, I = layout.sorted_token_ids.shape[0], p2.in_features
    out = fused_experts(x, p13, p2, layout, weights, CFG, CFG, out=_poisoned((T * layout.top_k, D), x.dtype),
                        workspace=_poisoned((rows, I), x.dtype), **kw)
    return out, fused_experts_ref(x, p13, p2, layout, weights)


@pytest.mark.parametrize("T,E,K", [(1, 6, 2), (7, 10, 4), (33, 6, 2), (33, 10, 1)])
def test_plain_weights(T, E, K):
    x, w13, w2, ids, weights = _problem(T, E, K, D=32, I=48, seed=T + E)
    layout = align_block_size(ids, E, CFG.block_m)
    out, ref = _run_both(x, quantize(w13, WeightFormat.NONE), quantize(w2, WeightFormat.NONE), layout, weights)
    assert not out.isnan().any()  # poisoned out/workspace slots never leak
    torch.testing.assert_close(out, ref, **FP32_TOL)


@pytest.mark.parametrize("fmt,group", [(WeightFormat.INT8, 0), (WeightFormat.FP8, 0), (WeightFormat.INT4, 64)])
def test_quantized_weights(fmt, group):
    x, w13, w2, ids, weights = _problem(7, 6, 2, D=64, I=64, seed=5)
    layout = align_block_size(ids, 6, CFG.block_m)
    out, ref = _run_both(x, quantize(w13, fmt, group or 128), quantize(w2, fmt, group or 128), layout, weights)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **FP32_TOL)


def test_int4_group_128():
    x, w13, w2, ids, weights = _problem(7, 6, 2, D=128, I=128, seed=6)
    layout = align_block_size(ids, 6, CFG.block_m)
    p13, p2 = quantize(w13, WeightFormat.INT4, 128), quantize(w2, WeightFormat.INT4, 128)
    out, ref = _run_both(x, p13, p2, layout, None)
    torch.testing.assert_close(out, ref, **FP32_TOL)


def test_all_tokens_to_one_expert_without_weights():
    x, w13, w2, ids, _ = _problem(33, 6, 2, D=32, I=32, seed=7, topk_ids=all_to_one(33, 6, 2))
    layout = align_block_size(ids, 6, CFG.block_m)
    out, ref = _run_both(x, quantize(w13, WeightFormat.NONE), quantize(w2, WeightFormat.NONE), layout, None)
    torch.testing.assert_close(out, ref, **FP32_TOL)


def test_expert_map_zeroes_remote_copies():
    x, w13, w2, ids, weights = _problem(7, 6, 2, D=32, I=32, seed=8)
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3])  # 4 local slots
    local = torch.tensor([0, 2, 3, 5])
    layout = align_block_size(ids, 6, CFG.block_m, expert_map)
    p13, p2 = quantize(w13[local], WeightFormat.NONE), quantize(w2[local], WeightFormat.NONE)
    out, ref = _run_both(x, p13, p2, layout, weights)
    torch.testing.assert_close(out, ref, **FP32_TOL)
    remote = (ids == 1) | (ids == 4)  # [T, K]
    assert bool((out[remote.reshape(-1)] == 0).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activations(dtype):
    x, w13, w2, ids, weights = _problem(7, 6, 2, D=32, I=32, seed=9, dtype=dtype)
    layout = align_block_size(ids, 6, CFG.block_m)
    p13, p2 = quantize(w13.to(dtype), WeightFormat.NONE), quantize(w2.to(dtype), WeightFormat.NONE)
    out, ref = _run_both(x, p13, p2, layout, weights)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_config_block_m_must_match_layout():
    x, w13, w2, ids, _ = _problem(1, 6, 2, D=32, I=32)
    layout = align_block_size(ids, 6, 32)
    with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
        fused_experts(x, quantize(w13, WeightFormat.NONE), quantize(w2, WeightFormat.NONE), layout, None, CFG, CFG)
