"""Combine kernel vs its twin and vs the torch backend's unpermute.

Tolerance fp32: atol 1e-6 (K ≤ 4 products summed in fp32, different association only).
"""

import pytest
import torch

from moetune.kernels.combine import combine
from moetune.kernels.reference import combine_ref
from moetune.moe.unpermute import unpermute


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("weighted", [True, False])
def test_combine_matches_twin(T, K, weighted):
    g = torch.Generator().manual_seed(T * K)
    y = torch.randn(T, K, 40, generator=g)  # [T, K, D], D not a power of two
    w = torch.rand(T, K, generator=g) if weighted else None
    torch.testing.assert_close(combine(y, w), combine_ref(y, w), atol=1e-6, rtol=0)


def test_combine_equals_unpermute_of_copy_order():
    T, K, D = 7, 2, 24
    y = torch.randn(T * K, D)  # [T*K, D] copy order
    w = torch.rand(T, K)
    identity = torch.arange(T * K)
    torch.testing.assert_close(combine(y.view(T, K, D), w), unpermute(y, identity, w), atol=1e-6, rtol=0)


def test_combine_bf16_accumulates_in_fp32():
    """One bf16 ulp allowed: Triton's CPU interpreter converts fp32 → bf16 by truncation, torch
    (and the GPU) round to nearest even."""
    y = torch.randn(5, 4, 32).bfloat16()
    w = torch.rand(5, 4)
    out = combine(y, w)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), combine_ref(y, w).float(), atol=1e-6, rtol=2.0 ** -7)
