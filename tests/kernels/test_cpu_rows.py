"""The one-call CPU kernels of a step's small ops against their torch twins: RMSNorm and rotary
(`kernels/cpu/rowwise.py`), top-k selection, permute and unpermute (`kernels/cpu/routing.py`), on
awkward shapes: T = 1, odd sizes, strided views, an empty expert, every token to one expert."""

import pytest
import torch

pytest.importorskip("numba")

from moetune.kernels.cpu.routing import permute_rows, select_topk, takes_routing, unpermute_rows  # noqa: E402
from moetune.kernels.cpu.rowwise import rms_norm, rope_  # noqa: E402
from moetune.kernels.reference import select_experts_ref  # noqa: E402
from moetune.model.norm import RMSNorm  # noqa: E402
from moetune.model.rope import Rotary  # noqa: E402
from moetune.moe.permute import permute  # noqa: E402
from moetune.moe.unpermute import unpermute  # noqa: E402
from moetune.spec import RopeSpec, RouterSpec  # noqa: E402


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 7), (5, 64), (3, 4, 33), (0, 16)])
def test_rms_norm_matches_the_torch_norm(shape):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=g) * 3, torch.randn(shape[-1], generator=g)
    _close(rms_norm(x, w, 1e-6), RMSNorm(w, 1e-6)(x))
    assert RMSNorm(w, 1e-6, kernel=True)(x).shape == x.shape


def test_rms_norm_reads_a_strided_view():
    g = torch.Generator().manual_seed(1)
    buf, w = torch.randn(4, 3, 10, generator=g), torch.randn(10, generator=g)
    per_head = buf[:, 1:, :]  # [4, 2, 10]: rows not evenly strided
    cols = buf.view(4, 30)[:, 5:15]  # [4, 10] with a row stride of 30
    for x in (per_head, cols):
        _close(rms_norm(x, w, 1e-5), RMSNorm(w, 1e-5)(x))


def test_rms_norm_refuses_other_dtypes():
    with pytest.raises(ValueError, match="fp32"):
        rms_norm(torch.zeros(2, 4, dtype=torch.float64), torch.ones(4), 1e-6)
    x = torch.randn(2, 4, dtype=torch.bfloat16)  # the kernel flag leaves non-fp32 inputs to torch
    _close(RMSNorm(torch.ones(4, dtype=torch.bfloat16), 1e-6, kernel=True)(x).float(),
           RMSNorm(torch.ones(4, dtype=torch.bfloat16), 1e-6)(x).float())


@pytest.mark.parametrize("T,H,R", [(1, 1, 2), (3, 5, 64), (7, 2, 30)])
def test_rope_matches_rotary_apply_in_place_on_a_view(T, H, R):
    g = torch.Generator().manual_seed(2)
    rotary = Rotary(RopeSpec(dim=R, theta=10000.0), torch.device("cpu"))
    cos, sin = rotary.cos_sin(torch.randint(0, 4000, (T,), generator=g), torch.float32, 4000)  # [T, R]
    qkv = torch.randn(T, 3 * H * R, generator=g)
    k = qkv[:, H * R : 2 * H * R].view(T, H, R)  # a strided view, as attention's split gives
    want = rotary.apply(k.clone(), cos, sin)
    before = qkv.clone()
    assert rope_(k, cos, sin) is k
    _close(k, want)
    _close(qkv[:, : H * R], before[:, : H * R])  # nothing outside the view is written
    _close(qkv[:, 2 * H * R :], before[:, 2 * H * R :])


def test_rotary_apply_in_place_with_and_without_the_kernel():
    g = torch.Generator().manual_seed(3)
    spec = RopeSpec(dim=16, theta=500.0)
    cos, sin = Rotary(spec, torch.device("cpu")).cos_sin(torch.arange(4), torch.float32, 4)
    x = torch.randn(4, 3, 16, generator=g)
    want = Rotary(spec, torch.device("cpu")).apply(x, cos, sin)
    for kernel in (False, True):
        _close(Rotary(spec, torch.device("cpu"), kernel=kernel).apply_(x.clone(), cos, sin), want)
    inter = RopeSpec(dim=16, theta=500.0, interleave=True)  # the kernel leaves the interleaved form to torch
    _close(Rotary(inter, torch.device("cpu"), kernel=True).apply_(x.clone(), cos, sin),
           Rotary(inter, torch.device("cpu")).apply(x, cos, sin))


ROUTERS = [
    RouterSpec(score="softmax", top_k=2),
    RouterSpec(score="softmax", top_k=3, renormalize=False),
    RouterSpec(score="sigmoid", top_k=4, renormalize=True, scaling_factor=2.5, has_selection_bias=True),
    RouterSpec(score="softmax", top_k=1, scaling_factor=0.5),
    RouterSpec(score="sigmoid", top_k=2, n_group=4, topk_group=4),  # every group kept: no limit
]


@pytest.mark.parametrize("spec", ROUTERS)
@pytest.mark.parametrize("T", [1, 13, 0])
def test_select_topk_matches_the_torch_twin(spec, T):
    g = torch.Generator().manual_seed(4)
    E = 12
    logits = torch.randn(T, E, generator=g) * 2
    bias = torch.randn(E, generator=g) * 0.3 if spec.has_selection_bias else None
    w, ids = select_topk(logits, spec, bias)
    w_ref, ids_ref = select_experts_ref(logits, spec, bias)
    assert ids.dtype == torch.int64 and torch.equal(ids, ids_ref)
    _close(w, w_ref)


def test_select_topk_one_dominant_expert_and_ties():
    spec = RouterSpec(top_k=2)
    logits = torch.zeros(3, 6)
    logits[:, 4] = 50.0  # every token picks 4 first; the rest tie: the lowest id wins
    w, ids = select_topk(logits, spec)
    assert ids[:, 0].tolist() == [4, 4, 4] and ids[:, 1].tolist() == [0, 0, 0]
    _close(w.sum(-1), torch.ones(3))


def test_select_topk_refuses_a_group_limit():
    spec = RouterSpec(score="sigmoid", top_k=2, n_group=4, topk_group=2)
    assert not takes_routing(spec)
    with pytest.raises(ValueError, match="group"):
        select_topk(torch.zeros(2, 8), spec)


def _routing_case(name: str, T: int, K: int, P: int, g):
    if name == "random":
        return torch.stack([torch.randperm(P, generator=g)[:K] for _ in range(T)]) if T else torch.zeros(0, K, dtype=torch.long)
    if name == "all-to-one":
        return torch.full((T, K), P - 1, dtype=torch.long)
    ids = torch.randint(0, P - 1, (T, K), generator=g)  # slot P-1 stays empty
    return ids


@pytest.mark.parametrize("T,K,P", [(1, 1, 1), (1, 2, 8), (9, 3, 5), (64, 8, 64), (0, 2, 4)])
@pytest.mark.parametrize("name", ["random", "all-to-one", "empty-slot"])
def test_permute_and_unpermute_match_the_torch_phases(T, K, P, name):
    if name != "all-to-one" and K > P - (name == "empty-slot"):
        pytest.skip("needs more slots than choices")
    g = torch.Generator().manual_seed(5)
    D = 11
    x = torch.randn(T, D, generator=g)
    slot_ids = _routing_case(name, T, K, P, g)
    got, want = permute_rows(x, slot_ids, P), permute(x, slot_ids, P)
    for a, b in zip(got, want):
        assert torch.equal(a, b)  # a stable sort: the same order, the same rows
    y_sorted = torch.randn(T * K, D, generator=g)
    weights = torch.rand(T, K, generator=g)
    shared = torch.randn(T, D, generator=g)
    for s in (None, shared):
        _close(unpermute_rows(y_sorted, want.sorted_copy_ids, weights, s),
               unpermute(y_sorted, want.sorted_copy_ids, weights, s))


def test_permute_refuses_a_slot_out_of_range():
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        permute_rows(torch.zeros(2, 3), torch.tensor([[0, 4], [1, 2]]), 4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        permute_rows(torch.zeros(1, 3), torch.tensor([[-1]]), 4)
