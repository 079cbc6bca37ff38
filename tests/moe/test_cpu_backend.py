"""The `cpu` kernel backend against the torch twin: same experts output, same MoE layer output."""

import pytest
import torch

pytest.importorskip("numba")

from moetune.errors import MoetuneError  # noqa: E402
from moetune.experts.store import ExpertWeights, ResidentExpertStore, SlotMap  # noqa: E402
from moetune.kernels.cpu import quantize_int4, quantize_int8  # noqa: E402
from moetune.kernels.cpu import runtime  # noqa: E402
from moetune.kernels.cpu.linear import rounding_rel  # noqa: E402
from moetune.moe.backend import TorchBackend, resolve_backend  # noqa: E402
from moetune.moe.cpu_backend import CPUBackend  # noqa: E402
from moetune.moe.layer import MoELayer  # noqa: E402
from moetune.moe.permute import permute  # noqa: E402
from moetune.spec import MoESpec, RouterSpec  # noqa: E402


def _weights(E: int, D: int, I: int, fmt: str = "fp32", seed: int = 0) -> ExpertWeights:
    g = torch.Generator().manual_seed(seed)
    w13, w2 = torch.randn(E, 2 * I, D, generator=g) * 0.2, torch.randn(E, D, I, generator=g) * 0.2
    if fmt == "fp32":
        return ExpertWeights.dense(w13, w2)
    quant = quantize_int8 if fmt == "int8" else lambda w: quantize_int4(w, 64)
    return ExpertWeights(quant(w13), quant(w2), SlotMap(E))


def _both(x, ids, weights, max_rows=16):
    perm = permute(x, ids, weights.num_slots)
    got = CPUBackend(max_rows).experts(perm.x_sorted, perm.offsets, weights)
    want = TorchBackend().experts(perm.x_sorted, perm.offsets, weights)
    return got, want


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * max(1.0, want.abs().max().item() if want.numel() else 1))


@pytest.fixture(params=["serial", "parallel"])
def parallel(request, monkeypatch):
    """Each case on one thread and, with the small-work rule off, on every thread numba has."""
    if request.param == "parallel":
        monkeypatch.setattr(runtime, "SERIAL_BYTES", 0)


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("case", ["T=1", "odd-T", "empty-expert", "all-to-one", "all-to-one-big", "mixed-big-small"])
def test_experts_match_the_torch_twin(fmt, case, parallel):
    E, D, I = (6, 128, 64) if fmt == "int4" else (6, 47, 33)  # int4 needs K a multiple of its group
    g = torch.Generator().manual_seed(1)
    T = {"T=1": 1, "odd-T": 7, "empty-expert": 5, "all-to-one": 9, "all-to-one-big": 21, "mixed-big-small": 23}[case]
    x = torch.randn(T, D, generator=g)
    if case.startswith("all-to-one"):  # 9 rows: the kernel; 21 rows (> 16): torch's GEMM
        ids = torch.full((T, 1), 4)
    elif case == "mixed-big-small":  # expert 0 gets every token (23 rows > 16: torch), others a few (kernel)
        ids = torch.stack([torch.zeros(T, dtype=torch.long), 1 + torch.arange(T) % 5], dim=1)
    else:
        ids = torch.stack([torch.randperm(E - 1, generator=g)[:2] for _ in range(T)])  # expert E-1 empty
    got, want = _both(x, ids, _weights(E, D, I, fmt))
    assert got.block_m == 1 and got.y.shape == want.y.shape == (T * ids.shape[1], D)
    if fmt == "int4":  # x and the activation rounded to int8 per group of 64 (`runtime.Q4_INTERLEAVED`): the
        # stated bound, 2 stages · 2 · rounding_rel (tests/kernels/test_cpu_kernels.py: close_fmt)
        assert ((got.y - want.y).norm() / want.y.norm()).item() <= 4 * rounding_rel(64, 127)
    else:
        _close(got.y, want.y)


def test_no_rows_and_every_slot_over_the_limit():
    w = _weights(4, 16, 8)
    got, want = _both(torch.randn(0, 16), torch.zeros(0, 2, dtype=torch.long), w)
    assert got.y.shape == (0, 16)
    x = torch.randn(9, 16)
    got, want = _both(x, torch.stack([torch.arange(9) % 4, (torch.arange(9) + 1) % 4], 1), w, max_rows=1)
    _close(got.y, want.y)  # every slot has 2+ rows: all through torch's GEMMs


def test_inputs_the_kernels_do_not_take_run_the_twin():
    w = _weights(3, 16, 8)
    bf16 = ExpertWeights.dense(w.w13.data.bfloat16(), w.w2.data.bfloat16())
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    got, want = _both(x, torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2]]), bf16)
    assert torch.equal(got.y, want.y)


def test_moe_layer_under_cpu_equals_torch():
    E, D = 8, 40
    spec = MoESpec(num_experts=E, intermediate_size=24, router=RouterSpec(top_k=2))
    store = ResidentExpertStore({0: _weights(E, D, 24)})
    gate = torch.randn(E, D)
    x = torch.randn(11, D)
    ours = MoELayer(0, spec, gate, None, store, backend=CPUBackend())(x)
    twin = MoELayer(0, spec, gate, None, store, backend=TorchBackend())(x)
    _close(ours, twin)


def test_auto_is_cpu_on_the_cpu_and_cpu_refuses_cuda():
    assert resolve_backend("auto", torch.device("cpu")).name == "cpu"
    assert resolve_backend("torch", torch.device("cpu")).name == "torch"
    with pytest.raises(MoetuneError, match="runs on the CPU"):
        resolve_backend("cpu", torch.device("cuda"))


def test_a_layer_in_several_formats_runs_each_format_group_through_the_kernels():
    """Mixed-precision layers (format groups over contiguous slot ranges) under the cpu backend
    equal the torch twin, which dequantises slot by slot."""
    from moetune.experts.store import ExpertWeights, FormatGroup, SlotMap
    from moetune.kernels.cpu import quantize_int4, quantize_int8
    from moetune.kernels.quant_formats import plain
    from moetune.moe.backend import TorchBackend
    from moetune.moe.cpu_backend import CPUBackend
    from moetune.moe.permute import permute

    gen = torch.Generator().manual_seed(3)
    E, D, I, T, K = 6, 64, 64, 5, 2
    w13, w2 = torch.randn(E, 2 * I, D, generator=gen) * 0.1, torch.randn(E, D, I, generator=gen) * 0.1
    groups = [FormatGroup(0, 2, plain(w13[:2]), plain(w2[:2])),
              FormatGroup(2, 4, quantize_int8(w13[2:4]), quantize_int8(w2[2:4])),
              FormatGroup(4, 6, quantize_int4(w13[4:], 64), quantize_int4(w2[4:], 64))]
    weights = ExpertWeights.from_groups(groups, SlotMap(E))
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])  # [T, K]
    perm = permute(torch.randn(T, D, generator=gen), ids, E)
    ref = TorchBackend().experts(perm.x_sorted, perm.offsets, weights).y
    out = CPUBackend().experts(perm.x_sorted, perm.offsets, weights).y
    rows = slice(int(perm.offsets[4]), None)  # the int4 group's rows: x rounded to int8 (`runtime.Q4_INTERLEAVED`)
    torch.testing.assert_close(out[:rows.start], ref[:rows.start], atol=1e-4, rtol=1e-4)
    assert ((out[rows] - ref[rows]).norm() / ref[rows].norm()).item() <= 4 * rounding_rel(64, 127)
    CPUBackend().warm(weights)  # compiles each group's format without tripping over the mixed layer


def test_small_experts_stay_on_the_kernel_for_more_rows(monkeypatch):
    """Under 1 MiB per expert the kernel takes slots up to 64 rows (torch's per-slot calls cost more
    there); a bigger expert goes to torch's GEMM beyond 16; an explicit max_rows wins."""
    small, big = _weights(4, 64, 32), _weights(2, 256, 512)  # 24 KiB and 1.5 MiB per expert in fp32
    assert CPUBackend().row_limit(small) == 64 and CPUBackend().row_limit(big) == 16
    assert CPUBackend(8).row_limit(small) == 8
    from moetune.moe import cpu_backend

    torch_slots = []
    real = cpu_backend.slot_matrix
    monkeypatch.setattr(cpu_backend, "slot_matrix", lambda w, e, dtype: torch_slots.append(e) or real(w, e, dtype))
    x = torch.randn(40, 64)
    ids = torch.stack([torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long)], 1)  # 40 rows each
    got, want = _both(x, ids, small, max_rows=None)
    torch.testing.assert_close(got.y, want.y, rtol=1e-4, atol=1e-4)
    assert not torch_slots  # every slot through the kernel
    got, want = _both(x, ids, small, max_rows=16)
    assert sorted(set(torch_slots)) == [0, 1]  # with the 16-row limit both slots take torch's GEMM
    torch.testing.assert_close(got.y, want.y, rtol=1e-4, atol=1e-4)


def test_slots_over_the_row_limit_and_under_it_fill_every_row(monkeypatch):
    """torch's GEMM for the big slots, the kernel for the small ones, an empty slot between: every
    row written (the output is not zero-filled first, so a row left out would be garbage)."""
    from moetune.moe import cpu_backend

    real_empty = torch.empty
    monkeypatch.setattr(cpu_backend.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    weights = _weights(4, 64, 32)
    x = torch.randn(30, 64)
    ids = torch.stack([torch.zeros(30, dtype=torch.long), torch.where(torch.arange(30) < 3, 1, 3)], 1)  # slot 2: none
    got, want = _both(x, ids, weights, max_rows=8)  # slots 0 (30 rows) and 3 (27) to torch, slot 1 (3) to the kernel
    assert not got.y.isnan().any()
    torch.testing.assert_close(got.y, want.y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T", [0, 1, 5, 64, 65])
def test_router_logits_match_the_torch_gemm(T):
    g = torch.Generator().manual_seed(7)
    x, gate = torch.randn(T, 33, generator=g), torch.randn(6, 33, generator=g)
    torch.testing.assert_close(CPUBackend().router_logits(x, gate), TorchBackend().router_logits(x, gate),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vnni", [True, False])
def test_int4_prefill_takes_the_kernels_only_with_vnni(monkeypatch, vnni):
    """int4 slots stay on the interleaved kernels at every row count where the kernels have a VNNI dot
    product; elsewhere big slots take the panels (`kernels/cpu/panels.py`), exact against the twin."""
    from moetune.moe import cpu_backend

    monkeypatch.setattr(cpu_backend, "int4_kernel_at_prefill", lambda: vnni)
    w = _weights(3, 128, 64, "int4")
    limit = CPUBackend().row_limit(w)
    assert (limit == cpu_backend.INT4_ROWS) == vnni
    x = torch.randn(70, 128, generator=torch.Generator().manual_seed(3))
    perm = permute(x, torch.full((70, 1), 1), w.num_slots)
    got = CPUBackend().experts(perm.x_sorted, perm.offsets, w).y
    want = TorchBackend().experts(perm.x_sorted, perm.offsets, w).y
    if vnni:  # x rounded to int8 parts on the kernels
        assert ((got - want).norm() / want.norm()).item() <= 4 * rounding_rel(64, 127)
    else:  # 70 rows > the limit: the panels, fp32 x
        _close(got, want)
