"""CPU decode kernels (numba) against their torch twins, on awkward shapes; quantize round trips."""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("numba")

from moetune.kernels.cpu import (dequantize_int4, dequantize_int8, fused_experts_cpu,  # noqa: E402
                                 fused_experts_cpu_ref, linear, linear_ref, quantize_int4, quantize_int8)
from moetune.kernels.cpu import experts as experts_module  # noqa: E402
from moetune.kernels.cpu import runtime  # noqa: E402
from moetune.kernels.quant_formats import PackedWeight, WeightFormat  # noqa: E402

FORMATS = {"fp32": lambda w: w, "int8": quantize_int8, "int4g32": lambda w: quantize_int4(w, 32),
           "int4g64": lambda w: quantize_int4(w, 64), "int4g128": lambda w: quantize_int4(w, 128)}


@pytest.fixture(params=["serial", "parallel"])
def threads(request, monkeypatch):
    """Run a test on one thread and, with the small-work rule off, on two."""
    if request.param == "parallel":
        monkeypatch.setattr(runtime, "SERIAL_BYTES", 0)
        return 2
    return 1


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * max(1.0, b.abs().max().item() if b.numel() else 1.0))


def close_fmt(a: torch.Tensor, b: torch.Tensor, fmt: str, stages: int) -> None:
    """`close`, but int4 (the interleaved kernels round x to int8 per group, `runtime.Q4_INTERLEAVED`): within
    the stated rounding bound, stages · 2 · `rounding_rel(group, 127)` of the norm (each of the
    `stages` packed weights on the path rounds its input once; gain ≤ 1 per stage, tests/model/test_dense_quant.py)."""
    if not (fmt.startswith("int4") and runtime.Q4_INTERLEAVED):
        return close(a, b)
    from moetune.kernels.cpu.linear import rounding_rel

    bound = stages * 2 * rounding_rel(int(fmt[5:]), 127)
    assert ((a - b).norm() / b.norm().clamp_min(1e-30)).item() <= bound


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M", [1, 2, 3, 4, 7, 16, 21])
def test_linear_matches_twin(fmt, M, threads):
    g = torch.Generator().manual_seed(M)
    K = 128 if fmt.startswith("int4") else 95
    w = FORMATS[fmt](torch.randn(47, K, generator=g))
    x = torch.randn(M, K, generator=g)
    close_fmt(linear(x, w, threads=threads), linear_ref(x, w), fmt, 1)


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4g64"])
def test_linear_non_contiguous_and_empty(fmt):
    g = torch.Generator().manual_seed(0)
    w = FORMATS[fmt](torch.randn(33, 256, generator=g))
    x = torch.randn(256, 5, generator=g).t()  # [5, 256], not contiguous
    close_fmt(linear(x, w), linear_ref(x, w), fmt, 1)
    assert linear(x[:0], w).shape == (0, 33)
    wt = torch.randn(256, 33, generator=g).t()  # a non-contiguous fp32 weight [33, 256]
    close(linear(x, wt), linear_ref(x, wt))


def test_linear_rejects_bad_input():
    int4_k96 = PackedWeight(torch.zeros(4, 48, dtype=torch.uint8), torch.ones(4, 1), WeightFormat.INT4, 64)
    with pytest.raises(ValueError, match="group size"):  # K = 96 is not a multiple of the group
        linear(torch.randn(1, 96), int4_k96)
    with pytest.raises(ValueError, match="group size"):
        quantize_int4(torch.randn(4, 96), 64)
    with pytest.raises(ValueError, match="K=8"):
        linear(torch.randn(1, 8), torch.randn(4, 9))
    with pytest.raises(ValueError, match="fp32"):
        linear(torch.randn(1, 8, dtype=torch.float64), torch.randn(4, 8))


def experts_case(rows_per_expert: list[int], D: int, I: int, fmt: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    E = len(rows_per_expert)
    offsets = torch.tensor([0] + rows_per_expert).cumsum(0)  # [E+1]
    x = torch.randn(int(offsets[-1]), D, generator=g)
    w13 = FORMATS[fmt](torch.randn(E, 2 * I, D, generator=g) * 0.1)
    w2 = FORMATS[fmt](torch.randn(E, D, I, generator=g) * 0.1)
    return x, offsets, w13, w2


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [[1, 0, 0, 1], [0, 0, 19, 0], [3, 0, 5, 17], [0, 0, 0, 0], [1, 0, 6, 1]],
                         ids=["decode-top2", "all-to-one", "uneven-empty", "no-rows", "one-and-many"])
def test_experts_match_twin(fmt, rows, threads):
    D, I = (256, 128) if fmt.startswith("int4") else (47, 95)
    x, offsets, w13, w2 = experts_case(rows, D, I, fmt)
    y = fused_experts_cpu(x, offsets, w13, w2, threads=threads)
    assert y.shape == (sum(rows), D)
    if sum(rows):
        close_fmt(y, fused_experts_cpu_ref(x, offsets, w13, w2), fmt, 2)


@pytest.mark.parametrize("schedule", ["split", "whole"])
@pytest.mark.parametrize("fmt", ["fp32", "int8"])
@pytest.mark.parametrize("rows", [[1, 0, 0, 1], [0, 0, 19, 0], [3, 0, 5, 17], [2, 9, 1, 4], [1, 1, 1, 1, 1]],
                         ids=["decode-top2", "all-to-one", "uneven-empty", "four-uneven", "five-ones"])
def test_experts_both_schedules_match_twin(schedule, fmt, rows, threads, monkeypatch):
    """Whole experts per thread and column blocks give the twin's result, whatever the row counts
    and however the experts fall on the threads (five on two: lanes of three and two)."""
    monkeypatch.setattr(experts_module, "SCHEDULE", schedule)
    x, offsets, w13, w2 = experts_case(rows, 47, 95, fmt, seed=len(rows))
    close(fused_experts_cpu(x, offsets, w13, w2, threads=threads), fused_experts_cpu_ref(x, offsets, w13, w2))


@pytest.mark.parametrize("D,I", [(47, 95), (5, 3), (9, 2)])
def test_one_row_fp32_path_of_int8_weights_matches_twin(D, I, threads, monkeypatch):
    """With the integer path off, one-row int8 experts and a one-row int8 linear take the fp32 GEMV
    (GEMV_ROWS weight rows per pass, `_jit_tiles.gemv_rows`): odd column counts, fewer rows than a pass."""
    monkeypatch.setattr(runtime, "INT8_ROW", False)
    x, offsets, w13, w2 = experts_case([1, 0, 1], D, I, "int8", seed=D)
    close(fused_experts_cpu(x, offsets, w13, w2, threads=threads), fused_experts_cpu_ref(x, offsets, w13, w2))
    w = PackedWeight(w2.data[0], w2.scale[0], WeightFormat.INT8)  # [D, I]
    a = torch.randn(1, I, generator=torch.Generator().manual_seed(I))
    close(linear(a, w, threads=threads), linear_ref(a, w))


@pytest.mark.parametrize("rows,lanes_n", [([5, 1, 3, 3], 2), ([1, 1], 2), ([7, 0, 2, 9, 4], 2), ([3, 3, 3], 4)])
def test_plan_lanes_deals_most_rows_first_in_equal_counts(rows, lanes_n):
    import numpy as np

    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    active = np.flatnonzero(np.diff(offsets)).astype(np.int64)
    lanes_n = min(lanes_n, active.size)
    order, lanes = runtime.jit().plan_lanes(offsets, active, lanes_n)
    sizes = np.diff(lanes)
    assert sorted(order.tolist()) == active.tolist() and lanes[0] == 0 and lanes[-1] == active.size
    assert sizes.max() - sizes.min() <= 1  # the weights to read are shared out evenly
    loads = [sum(rows[e] for e in order[lanes[i]:lanes[i + 1]]) for i in range(lanes_n)]
    if rows == [5, 1, 3, 3]:
        assert sorted(loads) == [6, 6]  # 5+1 and 3+3, not 5+3 and 3+1


def test_experts_non_contiguous_int32_offsets_and_uncovered_rows():
    x, offsets, w13, w2 = experts_case([2, 0, 3], 40, 24, "fp32")
    x_nc = torch.stack([x, torch.zeros_like(x)], dim=-1)[..., 0]  # [5, 40] equal to x, stride 2
    close(fused_experts_cpu(x_nc, offsets.int(), w13, w2), fused_experts_cpu_ref(x, offsets, w13, w2))
    x_pad = torch.cat([x, torch.randn(2, 40)])  # two rows past offsets[-1] come back as 0
    y = fused_experts_cpu(x_pad, offsets, w13, w2)
    assert bool((y[5:] == 0).all())


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4g64"])
def test_experts_subset_computes_only_the_chosen_experts(fmt, threads):
    D, I = (128, 64) if fmt.startswith("int4") else (40, 24)
    x, offsets, w13, w2 = experts_case([2, 0, 3, 4], D, I, fmt)
    chosen = torch.tensor([0, 3])
    y = fused_experts_cpu(x, offsets, w13, w2, threads=threads, experts=chosen)
    want = fused_experts_cpu_ref(x, offsets, w13, w2, experts=chosen)
    close_fmt(y, want, fmt, 2)
    close_fmt(y[:2], fused_experts_cpu_ref(x, offsets, w13, w2)[:2], fmt, 2)
    assert bool((y[2:5] == 0).all())  # expert 2's rows were left out
    assert bool((fused_experts_cpu(x, offsets, w13, w2, experts=torch.tensor([], dtype=torch.long)) == 0).all())
    with pytest.raises(ValueError, match="experts must be ids"):
        fused_experts_cpu(x, offsets, w13, w2, experts=torch.tensor([4]))


def test_experts_into_out_leave_other_rows_as_they_were(threads):
    x, offsets, w13, w2 = experts_case([2, 0, 3, 4], 40, 24, "fp32")
    out = torch.full((9, 40), float("nan"))
    y = fused_experts_cpu(x, offsets, w13, w2, threads=threads, experts=torch.tensor([0, 3]), out=out)
    assert y is out
    want = fused_experts_cpu_ref(x, offsets, w13, w2)
    close(out[:2], want[:2])
    close(out[5:], want[5:])
    assert bool(out[2:5].isnan().all())  # expert 2's rows: not written
    with pytest.raises(ValueError, match="out must be"):
        fused_experts_cpu(x, offsets, w13, w2, out=torch.empty(9, 40).t().contiguous().t())


def test_experts_reject_bad_input():
    x, offsets, w13, w2 = experts_case([1, 1], 64, 32, "fp32")
    with pytest.raises(ValueError, match="offsets"):
        fused_experts_cpu(x, torch.tensor([0, 2, 1]), w13, w2)
    with pytest.raises(ValueError, match=r"\[E\+1\]"):
        fused_experts_cpu(x, torch.tensor([0, 2]), w13, w2)
    with pytest.raises(ValueError, match="share one format"):
        fused_experts_cpu(x, offsets, quantize_int8(w13), w2)
    with pytest.raises(ValueError, match="w13 must be"):
        fused_experts_cpu(x, offsets, w13, w2[:, :, :16])


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_round_trip_within_half_a_step(group):
    w = torch.randn(3, 8, 256)
    q = quantize_int4(w, group)
    assert q.data.shape == (3, 8, 128) and q.scale.shape == (3, 8, 256 // group)
    amax = w.view(3, 8, -1, group).abs().amax(-1).repeat_interleave(group, -1)  # [3, 8, 256]
    assert bool(((dequantize_int4(q) - w).abs() <= amax * (0.5 / 7) + 1e-6).all())


def test_int8_round_trip_within_half_a_step():
    w = torch.randn(5, 95)
    q = quantize_int8(w)
    assert q.data.dtype == torch.int8 and q.scale.shape == (5,)
    assert bool(((dequantize_int8(q) - w).abs() <= w.abs().amax(-1, keepdim=True) * (0.5 / 127) + 1e-6).all())


def test_int4_nibble_layout_matches_the_triton_format():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 7.0, -7.0  # scale 1 → q + 8 = 15 (low nibble of byte 0), 1 (high nibble)
    q = quantize_int4(w, 32)
    assert q.data[0, 0].item() == 15 | (1 << 4)


def test_threads_is_per_call():
    import numba

    before = numba.get_num_threads()
    linear(torch.randn(2, 64), torch.randn(8, 64), threads=1)
    assert numba.get_num_threads() == before


def test_launch_hands_small_calls_the_serial_twins_and_explicit_threads_win():
    """Under SERIAL_BYTES (or threads=1) the serial twins run and numba's thread count is not
    touched; an explicit thread count > 1 takes the parallel kernels even for small weights."""
    import numba

    before = numba.get_num_threads()
    with runtime.launch(None, runtime.SERIAL_BYTES - 1) as k:
        assert k.SERIAL and k.linear_dense is not runtime.jit().linear_dense
        assert numba.get_num_threads() == before
    with runtime.launch(1, 1 << 30) as k:
        assert k.SERIAL
    with runtime.launch(2, 1) as k:
        assert not k.SERIAL and k.linear_dense is runtime.jit().linear_dense
    with runtime.launch(None, runtime.SERIAL_BYTES) as k:
        assert not k.SERIAL
    assert numba.get_num_threads() == before


def test_import_does_not_load_numba():
    code = "import sys, moetune.kernels.cpu; assert 'numba' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


GEMV_ASM = """
import sys, numpy as np
from moetune.kernels.cpu import runtime
gemv = runtime.jit().GEMV_VARIANTS[4][0]
x, y, s = np.ones((1, 40), np.float32), np.zeros((1, 6), np.float32), np.ones(6, np.float32)
for w in (np.ones((6, 40), np.float32), np.ones((6, 40), np.int8)):
    gemv(x, 0, w, 0, 6, s, y, 0)
    assert (y == 40).all()
asm = {sig[2].dtype.name: gemv.inspect_asm(sig) for sig in gemv.signatures}
print("fp32", asm["float32"].count("prefetcht1"), "int8", asm["int8"].count("prefetcht1"))
"""


def test_the_four_row_gemv_asks_ahead_for_fp32_rows_only(tmp_path):
    """fp32 rows take `_simd_gemv`'s tile, which requests each stream's lines ahead (`prefetcht1`);
    int8 rows widened keep the plain loop, which requests nothing (its callers prefetch whole rows).
    In a process of its own with an empty numba cache: a kernel loaded from the disk cache has no assembly."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", GEMV_ASM], env=env, capture_output=True, text=True, check=True).stdout
    _, fp32, _, int8 = out.split()
    assert int(fp32) > 0 and int(int8) == 0


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("N,K,n0,n1", [(1, 5, 0, 1), (7, 33, 0, 7), (13, 64, 3, 13), (19, 95, 0, 19), (9, 8, 8, 9),
                                       (6, 1029, 1, 6)])
@pytest.mark.parametrize("wtype", ["fp32", "int8"])
def test_each_gemv_row_count_matches_torch(rows, N, K, n0, n1, wtype):
    """Both row counts of the one-x-row GEMV (the host runs one, `GEMV_ROWS`) against torch: rows [n0, n1)
    of w at any offset, counts that leave a tail of every size, and the experts' gate / up pass
    (`up_pairs`: gate rows j.., up rows I + j.. together) on the same shapes."""
    import numpy as np

    gemv, up_pairs = runtime.jit().GEMV_VARIANTS[rows]
    g = torch.Generator().manual_seed(N * K + rows)
    x = torch.randn(2, K, generator=g)
    w = torch.randn(N, K, generator=g) if wtype == "fp32" else torch.randint(-127, 128, (N, K), generator=g,
                                                                               dtype=torch.int8)
    s = torch.rand(N, generator=g) + 0.5
    y = np.full((2, N), np.nan, np.float32)
    gemv(x.numpy(), 1, w.numpy(), n0, n1, s.numpy(), y, 0)
    want = (x[1] @ w.float().T) * s  # [N]
    torch.testing.assert_close(torch.from_numpy(y[0, n0:n1]), want[n0:n1], rtol=1e-5, atol=1e-4)
    assert np.isnan(y[0, :n0]).all() and np.isnan(y[1]).all()  # nothing written outside [n0, n1) of row ym
    I = N  # we = [2I, K]: gate rows, then up rows
    we = torch.cat([w, w.flip(0)]).contiguous()
    s13 = torch.rand(1, 2 * I, generator=g) + 0.5
    a = np.full((2, I), np.nan, np.float32)
    up_pairs(x.numpy(), 1, we.numpy(), s13.numpy(), 0, a, n0, n1, False)
    h = (x[1] @ we.float().T) * s13[0]  # [2I]: gate, then up
    want = torch.nn.functional.silu(h[:I]) * h[I:]
    torch.testing.assert_close(torch.from_numpy(a[1, n0:n1]), want[n0:n1], rtol=1e-5, atol=1e-4)
    assert np.isnan(a[1, :n0]).all() and np.isnan(a[0]).all()
