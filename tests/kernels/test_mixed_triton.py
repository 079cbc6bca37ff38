"""The triton backend on a layer mixing formats (interpreter): one launch pair per format group,
slots outside the group mapped to -1, equals the torch twin and the CPU kernel on the same bytes."""

import torch

from moetune.experts.mixed import quantized_layer
from moetune.moe.experts import run_experts
from moetune.moe.permute import permute
from moetune.moe.triton_backend import TritonBackend


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
