"""Packing helpers: shapes, round-trip error bounds, int4 nibble layout."""

import pytest
import torch

from moetune.kernels.quant_formats import WeightFormat, dequantize, quantize


@pytest.mark.parametrize("fmt,bound", [(WeightFormat.INT8, 0.5 / 127), (WeightFormat.INT4, 0.5 / 7),
                                       (WeightFormat.FP8, 2.0 ** -4)])
def test_round_trip_error_is_within_half_a_step(fmt, bound):
    w = torch.randn(3, 8, 128)
    q = quantize(w, fmt, group_size=64)
    err = (dequantize(q) - w).abs()
    amax = w.abs().amax(dim=-1, keepdim=True) if fmt != WeightFormat.INT4 else \
        w.view(3, 8, 2, 64).abs().amax(-1).repeat_interleave(64, -1)
    assert bool((err <= bound * amax + 1e-6).all())
    assert q.in_features == 128 and q.out_features == 8


def test_int4_layout():
    w = torch.zeros(1, 1, 64)
    w[0, 0, 0], w[0, 0, 1] = 7.0, -7.0  # scale 1 → q = 15 (low nibble), 1 (high nibble)
    q = quantize(w, WeightFormat.INT4, group_size=64)
    assert q.data.shape == (1, 1, 32) and q.data.dtype == torch.uint8
    assert q.data[0, 0, 0].item() == 15 | (1 << 4)
    assert q.scale.shape == (1, 1, 1)


def test_int4_rejects_bad_group():
    with pytest.raises(ValueError, match="group_size"):
        quantize(torch.randn(1, 2, 96), WeightFormat.INT4, group_size=64)
