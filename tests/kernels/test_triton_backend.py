"""Whole layers: tiny random HF checkpoints loaded with kernel_backend 'torch' and 'triton'.

Tolerance fp32: atol = rtol = 1e-4 on final hidden states and logits (3 layers of fp32 math that
differs only in summation order; a routing flip would show as an O(1) difference).
"""

import pytest
import torch

from moetune.model.batch import StepBatch
from moetune.model.loader import load_model
from moetune.moe.backend import TorchBackend, resolve_backend
from moetune.moe.experts import run_experts
from moetune.moe.layer import MoELayer
from moetune.moe.permute import permute
from moetune.moe.router import route
from moetune.moe.triton_backend import TritonBackend
from moetune.moe.unpermute import unpermute

TOL = dict(atol=1e-4, rtol=1e-4)


def _forward(model, ids: torch.Tensor) -> torch.Tensor:
    T = ids.shape[0]
    batch = StepBatch(ids, torch.arange(T), [T], [T], [0])
    return model.forward(batch, model.new_cache(1, T))  # [T, D]


def _moe_layers(model) -> list[MoELayer]:
    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoELayer)]


@pytest.mark.parametrize("model_type", ["qwen3_moe", "deepseek_v3"])
def test_triton_backend_matches_torch_backend(checkpoint, model_type):
    path = checkpoint(model_type)
    ids = torch.randint(3, 300, (9,), generator=torch.Generator().manual_seed(0))
    ref_model = load_model(path, kernel_backend="torch")
    model = load_model(path, kernel_backend="triton")
    assert all(isinstance(m.backend, TritonBackend) for m in _moe_layers(model))
    ref, out = _forward(ref_model, ids), _forward(model, ids)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(model.logits(out), ref_model.logits(ref), **TOL)


def test_one_moe_layer_and_its_permute_output(checkpoint):
    model = load_model(checkpoint("qwen3_moe"), kernel_backend="torch")
    layer = _moe_layers(model)[0]
    x = torch.randn(7, model.spec.hidden_size)
    ref = layer(x)
    layer.backend = TritonBackend()
    torch.testing.assert_close(layer(x), ref, **TOL)
    routed = route(x, layer.gate_weight, layer.spec.router, None)
    perm_ref = permute(x, routed.topk_ids, layer.spec.num_experts)
    perm = layer.backend.permute(x, routed.topk_ids, layer.spec)
    assert torch.equal(perm.sorted_copy_ids, perm_ref.sorted_copy_ids)
    assert torch.equal(perm.counts, perm_ref.counts) and torch.equal(perm.offsets, perm_ref.offsets)
    assert perm.padded_rows == int(perm.aligned.num_tokens_post_padded)


def test_torch_backend_output_is_the_plain_phase_composition(checkpoint):
    """The backend protocol change keeps the torch path bit-for-bit."""
    model = load_model(checkpoint("qwen3_moe"), kernel_backend="torch")
    layer = _moe_layers(model)[0]
    assert isinstance(layer.backend, TorchBackend)
    x = torch.randn(7, model.spec.hidden_size)
    routed = route(x, layer.gate_weight, layer.spec.router, layer.selection_bias)
    perm = permute(x, routed.topk_ids, layer.spec.num_experts)
    y = run_experts(perm.x_sorted, perm.offsets, layer.store.weights(layer.layer)).y
    assert torch.equal(layer(x), unpermute(y, perm.sorted_copy_ids, routed.topk_weights))


def test_auto_picks_torch_on_cpu():
    assert isinstance(resolve_backend("auto", torch.device("cpu")), TorchBackend)


def test_triton_on_cpu_cannot_switch_to_the_interpreter_after_the_kernels_were_imported(monkeypatch):
    import moetune.kernels.moe_gemm  # noqa: F401  (imported here under the interpreter: a stand-in)
    from moetune.errors import MoetuneError

    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(MoetuneError, match="already imported"):
        resolve_backend("triton", torch.device("cpu"))
