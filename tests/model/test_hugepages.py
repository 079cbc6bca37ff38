"""Weights moved into the huge-page arena keep their values, shapes, views and sharing."""

import mmap

import pytest
import torch

from moetune.model.hugepages import huge_empty, to_huge_pages


def test_moved_tensors_keep_values_views_and_ties():
    a = torch.randn(300, 70)
    view = a[10:20]  # a view of a: moved with it
    tied = a  # the same object twice (a tied LM head)
    b = torch.randn(5, dtype=torch.float16)
    c = torch.arange(7, dtype=torch.int8)
    before = [t.clone() for t in (a, view, b, c)]
    moved = to_huge_pages([a, view, tied, b, c])
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        assert moved == 0
        return
    assert moved >= a.numel() * 4 + b.numel() * 2 + c.numel()
    for t, old in zip((a, view, b, c), before):
        assert torch.equal(t, old) and t.dtype == old.dtype
    assert view.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()  # still a view of a
    view.zero_()
    assert a[10:20].abs().sum() == 0
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # one arena
    assert a.data_ptr() % 64 == 0 and b.data_ptr() % 64 == 0 and c.data_ptr() % 64 == 0


def test_nothing_to_move_and_huge_empty():
    assert to_huge_pages([]) == 0
    assert to_huge_pages([torch.empty(0)]) == 0
    t = huge_empty((3, 4, 5), torch.bfloat16)
    assert t.shape == (3, 4, 5) and t.dtype == torch.bfloat16 and t.is_contiguous()
    t.fill_(1.5)
    assert float(t.float().sum()) == pytest.approx(90.0)


def test_a_loaded_cpu_model_lives_in_one_arena(checkpoint):
    from moetune.model.loader import load_model

    model = load_model(checkpoint("mixtral"), torch.float32, "cpu")
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform")
    arenas = {t.untyped_storage().data_ptr() for t in model.dense_tensors() + model.experts.tensors()}
    assert len(arenas) == 1


def test_bytes_are_counted_once_per_span():
    from moetune.tensors import distinct, nbytes, span

    a = torch.zeros(100, 10)  # 4000 bytes
    b = torch.zeros(7, dtype=torch.float64)  # 56 bytes
    head, tail, mid = a[:60], a[50:], a[20:30]  # overlapping views of a
    assert nbytes([a, a, b]) == 4056  # a tied tensor once
    assert nbytes([head, tail]) == 4000 and nbytes([mid]) == 400  # overlaps merged, a view is its own span
    assert nbytes([a[:, 0]]) == (99 * 10 + 1) * 4  # strided: first to last element
    assert span(a) == (a.data_ptr(), a.data_ptr() + 4000)
    assert [t is a for t in distinct([a, a, b, torch.empty(0)])] == [True, False]


def test_a_loaded_int4_cpu_model_reads_repacked_copies_made_at_load_in_one_arena(tmp_path):
    """The int4 kernels read interleaved copies of the weights (`q4r.repacked`), not the loaded tensors: the
    loader makes them for every int4 projection and resident expert before the first call, and moves them
    into one huge-page arena of their own (in torch's 4 KiB pages a decode step ran ~11 % longer)."""
    from moetune.kernels.cpu.q4r import repacked
    from moetune.model.dense_quant import packed_weights
    from moetune.model.loader import load_model
    from moetune.quant.table import PrecisionTable
    from tests.checkpoints import build_checkpoint

    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform")
    ck = build_checkpoint("mixtral", tmp_path, hidden_size=64, intermediate_size=64)  # dims the int4 group divides
    spec = load_model(ck, torch.float32, "cpu").spec
    table = PrecisionTable({i: ("int4-g32",) * spec.moe.num_experts for i in spec.moe_layers})
    model = load_model(ck, torch.float32, "cpu", precision=table, dense="int4-g32")
    experts = [w for i in model.experts.layers() for g in model.experts.weights(i).groups for w in (g.w13, g.w2)]
    weights = packed_weights(model) + experts
    assert len(weights) == 4 * len(model.layers) + 1  # qkv, o, w13, w2 a layer; the LM head
    copies = [t for w in weights for t in repacked(w)]  # the cached copies: the same tensors as at load
    arenas = {t.untyped_storage().data_ptr() for t in copies}
    loaded = {t.untyped_storage().data_ptr() for t in model.dense_tensors() + model.experts.tensors()}
    assert len(arenas) == 1 and not arenas & loaded
