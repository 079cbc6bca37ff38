"""Expert formats: packing error vs fp32 within stated bounds, and the kernels' limits."""

import pytest
import torch

from moetune.kernels.cpu import fused_experts_cpu
from moetune.kernels.cpu.linear import X_BLOCK, rounding_rel
from moetune.kernels.quant_formats import WeightFormat
from moetune.quant.formats import FORMAT_NAMES, format_of, pack, parse_format, unpack
from moetune.quant.names import QuantError, check_backend, parse_name

# relative Frobenius error of x @ W.T with W ~ N(0, 1) [E, N, K=256] and x ~ N(0, 1): the stated bounds
BOUNDS = {"fp32": 0.0, "bf16": 5e-3, "fp16": 1e-3, "fp8": 0.06, "int8": 0.012,
          "int4-g32": 0.12, "int4-g64": 0.14, "int4-g128": 0.16}


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_expert_gemm_error_vs_fp32_is_within_the_stated_bound(name):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 40, 256, generator=g)  # [E, N, K]
    x = torch.randn(9, 256, generator=g)  # [M, K]
    packed = pack(w, parse_format(name))
    assert format_of(packed) == name
    ref = torch.einsum("mk,enk->emn", x, w)
    got = torch.einsum("mk,enk->emn", x, unpack(packed))
    err = ((got - ref).norm() / ref.norm()).item()
    assert err <= BOUNDS[name], (name, err)
    if name != "fp32":
        assert err > 0  # really quantized


def test_packed_bytes_shrink_as_the_format_narrows():
    w = torch.randn(2, 64, 128)
    sizes = {n: sum(t.nbytes for t in (p.data, p.scale) if t is not None)
             for n in FORMAT_NAMES for p in [pack(w, parse_format(n))]}
    assert sizes["fp32"] > sizes["bf16"] > sizes["int8"] > sizes["int4-g128"]
    assert sizes["int4-g32"] > sizes["int4-g64"] > sizes["int4-g128"]


@pytest.mark.parametrize("bad,words", [("int9", "unknown expert format 'int9'"), ("int4-g48", "group size must be"),
                                       ("INT8", "unknown expert format")])
def test_bad_format_names_are_one_line(bad, words):
    with pytest.raises(QuantError, match=words):
        parse_format(bad)


def test_a_group_that_does_not_divide_the_dimension_is_refused_with_a_hint():
    with pytest.raises(QuantError, match=r"group size 64 does not divide K=96; use int4-g32 or int8"):
        pack(torch.randn(1, 4, 96), parse_format("int4-g64"))
    with pytest.raises(QuantError, match="use int8"):
        parse_name("int4-g32").check_dim(24, "I")


def test_int4_groups_are_reconciled_per_backend():
    check_backend({"int4-g32", "fp8"}, "torch")
    check_backend({"int4-g64", "int8"}, "triton")
    with pytest.raises(QuantError, match="triton.*int4-g32"):
        check_backend({"int4-g32"}, "triton")
    with pytest.raises(QuantError, match="cpu.*fp8"):
        check_backend({"fp8"}, "cpu")


@pytest.mark.parametrize("name", ["fp32", "int8", "int4-g32", "int4-g64", "int4-g128"])
def test_cpu_kernel_on_packed_weights_equals_the_dequantised_reference(name):
    """Awkward shapes: one expert with no rows, one with a single row, D and I not powers of two."""
    g = torch.Generator().manual_seed(1)
    E, D, I = 4, 384, {"int4-g64": 192, "int4-g128": 256}.get(name, 160)
    fmt = parse_format(name)
    w13, w2 = pack(torch.randn(E, 2 * I, D, generator=g) * 0.05, fmt), pack(torch.randn(E, D, I, generator=g) * 0.05, fmt)
    x = torch.randn(7, D, generator=g)
    offsets = torch.tensor([0, 3, 3, 4, 7])
    y = fused_experts_cpu(x, offsets, w13, w2)
    ref = torch.zeros_like(y)
    a, b = unpack(w13), unpack(w2)
    for e in range(E):
        s, t = int(offsets[e]), int(offsets[e + 1])
        h = x[s:t] @ a[e].t()
        ref[s:t] = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]) @ b[e].t()
    # the integer paths round x and the activation per block (`linear.rounding_rel`): two stages; int4 rounds
    # them to int8 parts (at most one part's step: `linear.x_levels`) and may read its interleaved copy's
    # scales in fp16 (2⁻¹¹ relative each)
    levels = 127 if name.startswith("int4") else 32767
    r = 0.0 if name == "fp32" else rounding_rel(fmt.group or X_BLOCK, levels) + (2.0 ** -11 if levels == 127 else 0)
    torch.testing.assert_close(y, ref, atol=1e-4 + 2 * r * ref.norm(dim=1).max().item(), rtol=1e-4)
    assert w13.fmt == {"fp32": WeightFormat.NONE, "int8": WeightFormat.INT8}.get(name, WeightFormat.INT4)
