"""The triton backend on a layer mixing formats (interpreter): one launch pair per format group,
slots outside the group mapped to -1, equals the torch twin and the CPU kernel on the same bytes."""

import torch

from moetune.experts.mixed import quantized_layer
from moetune.moe.experts import run_experts
from moetune.moe.permute import permute
from moetune.moe.triton_backend import TritonBackend
from moetune.kernels.cpu.linear import X_BLOCK, rounding_rel


def test_triton_mixed_groups_equal_the_torch_twin():
    g = torch.Generator().manual_seed(0)
    E, D, I = 6, 128, 64
    w13, w2 = torch.randn(E, 2 * I, D, generator=g) * 0.1, torch.randn(E, D, I, generator=g) * 0.1
    w = quantized_layer(w13, w2, ["int8", "fp32", "int4-g64", "int8", "fp8", "fp32"])
    x = torch.randn(5, D, generator=g)
    ids = torch.tensor([[0, 2], [4, 1], [2, 3], [5, 0], [0, 4]])
    perm = permute(x, w.slots.physical(ids), w.num_slots)
    got = TritonBackend().experts(perm.x_sorted, perm.offsets, w)
    ref = run_experts(perm.x_sorted, perm.offsets, w)
    torch.testing.assert_close(got.y, ref.y, atol=1e-4, rtol=1e-4)


def test_triton_and_the_cpu_kernels_agree_on_the_same_packed_bytes():
    from moetune.kernels.cpu import fused_experts_cpu

    g = torch.Generator().manual_seed(1)
    E, D, I = 5, 128, 64
    w13, w2 = torch.randn(E, 2 * I, D, generator=g) * 0.1, torch.randn(E, D, I, generator=g) * 0.1
    w = quantized_layer(w13, w2, ["int4-g64", "int8", "fp32", "int4-g64", "int8"])  # formats both kernels take
    x = torch.randn(4, D, generator=g)
    ids = torch.tensor([[0, 1], [2, 3], [4, 0], [3, 1]])
    perm = permute(x, w.slots.physical(ids), w.num_slots)
    triton_y = TritonBackend().experts(perm.x_sorted, perm.offsets, w).y
    off = perm.offsets.tolist()
    cpu_y = torch.empty_like(triton_y)
    for grp in w.groups:
        lo, hi = off[grp.start], off[grp.stop]
        cpu_y[lo:hi] = fused_experts_cpu(perm.x_sorted[lo:hi].contiguous(), perm.offsets[grp.start:grp.stop + 1] - lo,
                                         grp.w13, grp.w2)
    # the CPU kernels' integer paths round x and the activation per block: two stages of
    # `linear.rounding_rel` (int8's blocks of X_BLOCK; int4-g64's groups of 64) on each row
    r = rounding_rel(max(X_BLOCK, 64), 127) + 2.0 ** -11  # int4 rounds x to int8, its interleaved scales to fp16
    torch.testing.assert_close(triton_y, cpu_y, atol=1e-4 + 2 * r * cpu_y.norm(dim=1).max().item(), rtol=1e-4)
