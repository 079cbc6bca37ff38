"""A layer mixing formats: stored as format groups over contiguous slot ranges; every way of
computing it (torch twin per slot, CPU kernel per group's row range) equals the dequantised reference."""

import pytest
import torch
import torch.nn.functional as F

from moetune.experts.mixed import quantized_layer
from moetune.kernels.cpu import fused_experts_cpu
from moetune.kernels.cpu.linear import rounding_rel
from moetune.moe.experts import run_experts
from moetune.moe.permute import permute
from moetune.moe.unpermute import copy_order
from moetune.quant.formats import WeightFormat, pack, parse_format, unpack

FORMATS = ["int8", "fp32", "int4-g32", "fp32", "fp8", "int8", "bf16"]  # E = 7, formats interleaved


def _layer(E=7, D=64, I=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(E, 2 * I, D, generator=g) * 0.1, torch.randn(E, D, I, generator=g) * 0.1


def _reference(x, ids, w13, w2, formats):
    """Per token copy, expert e's weights packed alone in formats[e] and dequantised: [T*K, D] copy order."""
    I = w2.shape[2]
    rows = []
    for t in range(x.shape[0]):
        for e in ids[t].tolist():
            fmt = parse_format(formats[e])
            a, b = unpack(pack(w13[e:e + 1], fmt))[0], unpack(pack(w2[e:e + 1], fmt))[0]
            h = a @ x[t]
            rows.append(b @ (F.silu(h[:I]) * h[I:]))
    return torch.stack(rows)


def test_groups_are_contiguous_slot_ranges_ordered_by_format():
    w13, w2 = _layer()
    w = quantized_layer(w13, w2, FORMATS)
    assert [(g.start, g.stop) for g in w.groups] == [(0, 2), (2, 4), (4, 5), (5, 6), (6, 7)]
    assert w.mixed and w.w13 is None and w.num_slots == 7 and w.hidden_size == 64 and w.intermediate_size == 96
    # logical 0 and 5 (int8) → slots 0, 1; 1 and 3 (fp32) → 2, 3; 2 → 4; 4 → 5; 6 → 6
    assert w.slots.physical(torch.arange(7)[:, None]).flatten().tolist() == [0, 2, 4, 3, 5, 1, 6]
    one = quantized_layer(w13, w2, ["int8"] * 7)
    assert not one.mixed and one.slots.identity and one.w13 is one.groups[0].w13


@pytest.mark.parametrize("T", [1, 5, 13])
def test_torch_twin_on_a_mixed_layer_equals_the_per_expert_reference(T):
    w13, w2 = _layer()
    w = quantized_layer(w13, w2, FORMATS)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, 64, generator=g)
    ids = torch.stack([torch.randperm(7, generator=g)[:3] for _ in range(T)])  # [T, 3]
    perm = permute(x, w.slots.physical(ids), w.num_slots)
    y = run_experts(perm.x_sorted, perm.offsets, w).y
    torch.testing.assert_close(copy_order(y, perm.sorted_copy_ids), _reference(x, ids, w13, w2, FORMATS),
                               atol=1e-5, rtol=1e-5)


def test_cpu_kernel_per_group_row_range_equals_the_torch_twin():
    """The ExpertWeights contract: group g's rows are x[offsets[g.start]:offsets[g.stop]]."""
    formats = ["int8", "fp32", "int4-g32", "fp32", "int4-g32", "int8", "int8"]  # the CPU kernels' formats
    w13, w2 = _layer()
    w = quantized_layer(w13, w2, formats)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 64, generator=g)
    ids = torch.tensor([[0, 1, 2], [5, 6, 0], [3, 1, 0], [2, 5, 6], [0, 3, 5], [6, 1, 0]])  # expert 4 unused
    perm = permute(x, w.slots.physical(ids), w.num_slots)
    off = perm.offsets.tolist()
    y = torch.empty_like(perm.x_sorted)
    for grp in w.groups:
        lo, hi = off[grp.start], off[grp.stop]
        seg = perm.offsets[grp.start:grp.stop + 1] - lo
        y[lo:hi] = fused_experts_cpu(perm.x_sorted[lo:hi].contiguous(), seg, grp.w13, grp.w2)
    ref = run_experts(perm.x_sorted, perm.offsets, w).y
    # int4 groups round x and the activation to int8 per group and their interleaved scales to fp16
    # (`linear.rounding_rel` at `x_levels` 127, two stages); int8 / fp32 groups stay within 1e-4
    r = rounding_rel(32, 127) + 2.0 ** -11
    for grp in w.groups:
        lo, hi = off[grp.start], off[grp.stop]
        int4 = grp.w13.fmt == WeightFormat.INT4 and hi > lo
        atol = 1e-4 + (2 * r * ref[lo:hi].norm(dim=1).max().item() if int4 else 0)
        torch.testing.assert_close(y[lo:hi], ref[lo:hi], atol=atol, rtol=1e-4)
