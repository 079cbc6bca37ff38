"""The fused decode layer (model/fused_decode.py) against the unfused layer on the same decode steps:
the hidden states of every decode step and the greedy tokens."""

import pytest
import torch

from moetune.engine.generate import Generator
from moetune.engine.sampling import SamplingParams
from moetune.kernels.cpu import runtime
from moetune.experts.offload import OffloadingExpertStore, OffloadSettings
from moetune.model.fused_decode import FusedDecode
from moetune.model.loader import load_model
from moetune.moe.cpu_backend import CPUBackend
from moetune.moe.layer import MoELayer
from moetune.quant.table import PrecisionTable
from tests.checkpoints import build_checkpoint

PROMPTS = {"one": [[5, 9, 11, 4]], "three": [[5, 9, 11], [7, 3, 3, 8, 21, 6, 2], [30]]}


def _decode(model, prompts, fused: bool, steps: int = 10):
    """(greedy tokens per prompt, [T, D] hidden states of each decode step, layers run fused)."""
    keep, hidden, calls = model.fused, [], []
    model.fused = keep if fused else None
    forward = model.forward

    def recording(batch, cache):
        out = forward(batch, cache)
        if batch.num_single == batch.input_ids.shape[0]:
            hidden.append(out.clone())
        return out

    layer = FusedDecode._layer

    def counting(self, *args):
        calls.append(1)
        return layer(self, *args)

    model.forward = recording
    FusedDecode._layer = counting
    try:
        gen = Generator(model, tokenizer=None, eos_ids=frozenset())
        tokens = [c.token_ids for c in gen.generate(prompts, SamplingParams(max_tokens=steps, ignore_eos=True))]
    finally:
        FusedDecode._layer = layer
        del model.forward
        model.fused = keep
    return tokens, hidden, len(calls)


def _assert_same(model, prompts, fused_calls: bool = True, unfused_experts: bool | None = None):
    """Fused steps equal unfused ones; fused_calls: whether layers ran fused; unfused_experts: whether
    the fused steps handed experts to the unfused phases."""
    want, want_h, none = _decode(model, prompts, fused=False)
    finish, run_experts, inside, handed = FusedDecode._finish, MoELayer.run_experts, [], []

    def finishing(*args):
        inside.append(1)
        try:
            return finish(*args)
        finally:
            inside.pop()

    def spy(self, *args):
        handed.extend(inside)
        return run_experts(self, *args)

    FusedDecode._finish, MoELayer.run_experts = staticmethod(finishing), spy
    try:
        got, got_h, calls = _decode(model, prompts, fused=True)
    finally:
        FusedDecode._finish, MoELayer.run_experts = staticmethod(finish), run_experts
    assert none == 0 and (calls > 0) == fused_calls
    if unfused_experts is not None:
        assert bool(handed) == unfused_experts
    assert got == want
    assert len(got_h) == len(want_h)
    for a, b in zip(got_h, want_h):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["mixtral", "olmoe", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("prompts", ["one", "three"])
def test_fused_decode_steps_match_the_unfused_layers(model_type, prompts, checkpoint):
    """mixtral: sliding window (8, shorter than the context); olmoe: q/k norm over the projection and
    clip; qwen3_moe: per-head q/k norm, top-3 of 7; qwen2_moe: q/k/v bias, a gated shared expert,
    dense layers (unfused) between fused ones."""
    model = load_model(checkpoint(model_type))
    assert model.fused is not None
    _assert_same(model, PROMPTS[prompts], unfused_experts=False)


def test_deepseek_layers_stay_unfused(checkpoint):
    """MLA attention and group-limited routing: no layer is fused, and the steps are unchanged."""
    model = load_model(checkpoint("deepseek_v3"))
    assert not any(model.fused.covers(layer) for layer in model.layers)
    _assert_same(model, PROMPTS["three"], fused_calls=False)


def test_every_token_to_the_same_experts_and_the_row_limit(checkpoint):
    """A zero gate: every score ties, so every token takes experts 0 and 1 (the lowest ids) and the
    others stay empty. With a row limit of 2, three tokens on one expert take the unfused phases
    (torch's GEMM) after the fused attention half."""
    model = load_model(checkpoint("mixtral"))
    for layer in model.layers:
        layer.mlp.gate_weight.zero_()
    _assert_same(model, PROMPTS["three"], unfused_experts=False)
    for layer in model.layers:
        layer.mlp.backend = CPUBackend(max_rows=2)
    model.fused = FusedDecode()  # the row limit is read when a layer's experts are first seen
    _assert_same(model, PROMPTS["three"], unfused_experts=True)


@pytest.fixture(scope="module")
def ck64(tmp_path_factory):
    """qwen3_moe with D = I = 64 (int4 groups of 32 divide them)."""
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("fused64"), hidden_size=64,
                            moe_intermediate_size=64)


@pytest.mark.parametrize("fmt", ["int8", "int4-g32"])
def test_quantized_experts(fmt, ck64):
    """int8 and int4 experts run in moe_block (int4: `experts_int4`, experts of ≤ Q4_ROWS rows in
    integers), with the same steps as the unfused phases."""
    path = ck64
    spec = load_model(path).spec
    table = PrecisionTable({i: (fmt,) * spec.moe.num_experts for i in spec.moe_layers})
    _assert_same(load_model(path, precision=table), PROMPTS["three"], unfused_experts=False)


@pytest.mark.parametrize("dense", ["int8", "int4-g32"])
def test_quantized_dense_projections(dense, ck64, monkeypatch):
    """int8 and int4 QKV / o projections (experts in the same format) run in attention_block, with the
    same steps as the unfused layers; int4 past Q4_ROWS rows takes the fp32 nibble split there too."""
    spec = load_model(ck64).spec
    table = PrecisionTable({i: (dense,) * spec.moe.num_experts for i in spec.moe_layers})
    model = load_model(ck64, precision=table, dense=dense)
    assert all(model.fused.covers(layer) for layer in model.layers)
    _assert_same(model, PROMPTS["three"], unfused_experts=False)
    if dense.startswith("int4"):  # three rows past a Q4_ROWS of 2: the split path, fused and unfused
        monkeypatch.setattr(runtime, "Q4_ROWS", 2)
        _assert_same(model, PROMPTS["three"], unfused_experts=False)


def test_more_sequences_than_max_rows_run_unfused(checkpoint):
    model = load_model(checkpoint("qwen3_moe"))
    model.fused = FusedDecode(max_rows=2)
    _assert_same(model, PROMPTS["three"], fused_calls=False)


class _RoutingOnly:
    """A probe like serve's live expert-load window: routing only."""
    times_phases = False

    def __init__(self):
        self.ids: list[tuple[int, torch.Tensor]] = []

    def phase(self, layer, name):
        from contextlib import nullcontext
        return nullcontext()

    def routed(self, layer, route, permute, block_m):
        self.ids.append((layer, route.topk_ids.clone()))

    def moved(self, layer, dispatch_bytes, combine_bytes):
        pass


def test_a_routing_only_probe_hears_the_fused_layers_and_a_timing_probe_stops_fusion(checkpoint):
    model = load_model(checkpoint("qwen3_moe"))
    heard = {}
    for fused in (False, True):
        probe = _RoutingOnly()
        model.attach_probe(probe)
        _, _, calls = _decode(model, PROMPTS["three"], fused=fused, steps=4)
        assert (calls > 0) == fused
        heard[fused] = probe.ids
    assert [layer for layer, _ in heard[True]] == [layer for layer, _ in heard[False]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(heard[True], heard[False]))
    timing = _RoutingOnly()
    timing.times_phases = True
    model.attach_probe(timing)
    assert _decode(model, PROMPTS["three"], fused=True, steps=4)[2] == 0
    model.attach_probe(None)


def test_only_cpu_fp32_models_get_the_fused_path(checkpoint):
    path = checkpoint("mixtral")
    assert load_model(path, kernel_backend="torch").fused is None
    model = load_model(path)
    assert all(isinstance(layer.mlp, MoELayer) for layer in model.layers)
    assert all(model.fused.covers(layer) for layer in model.layers)


def test_an_offloading_store_sees_every_fused_layer(checkpoint):
    """The store's seam stays between the two fused calls: an offloading store (3 of 7 experts
    resident, a slot map that is not the identity) gives the unfused steps' numbers and counts its
    misses."""
    path = checkpoint("qwen3_moe", shard=False)
    settings = OffloadSettings(3, "lru", "host", None, 1)
    model = load_model(path, store_factory=lambda layers, spec: OffloadingExpertStore(
        layers, spec.moe.router.top_k, settings, "cpu"))
    _assert_same(model, PROMPTS["three"], unfused_experts=False)
    assert sum(s["misses"] for s in model.experts.stats().values()) > 0
    model.experts.close()


def test_a_capacity_set_after_load_turns_the_fused_layers_off(checkpoint):
    from moetune.engine.build import set_capacity

    model = load_model(checkpoint("mixtral"))
    assert _decode(model, PROMPTS["three"], fused=True, steps=3)[2] > 0  # the layers' kinds are decided here
    set_capacity(model, 1.0, "drop")
    _assert_same(model, PROMPTS["three"], fused_calls=False)


def test_loading_runs_the_fused_layers_once_so_the_first_request_does_not_compile_them(checkpoint):
    calls, layer = [], FusedDecode._layer

    def counting(self, *args):
        calls.append(1)
        return layer(self, *args)

    FusedDecode._layer = counting
    try:
        model = load_model(checkpoint("qwen3_moe"))
    finally:
        FusedDecode._layer = layer
    assert len(calls) == sum(model.fused.covers(x) for x in model.layers) > 0


def test_serves_expert_load_window_counts_the_same_routing_fused_and_unfused(checkpoint):
    from moetune.serve.expert_load import ExpertLoadWindow

    model = load_model(checkpoint("qwen3_moe"))
    counts = {}
    for fused in (False, True):
        window = ExpertLoadWindow(model, window_steps=1)  # every step counts into the one row
        model.attach_probe(window)
        calls = _decode(model, PROMPTS["three"], fused=fused, steps=4)[2]
        assert (calls > 0) == fused
        counts[fused] = window.counts()
    model.attach_probe(None)
    assert counts[True].sum() > 0 and (counts[True] == counts[False]).all()


def test_layers_that_differ_run_fused_each_with_its_own_settings(checkpoint):
    """One layer with another sliding window: each layer fused with its own."""
    import dataclasses

    model = load_model(checkpoint("mixtral"))
    attn = model.layers[1].attention
    attn.spec = dataclasses.replace(attn.spec, sliding_window=5)
    model.fused = FusedDecode()
    _assert_same(model, PROMPTS["three"], unfused_experts=False)


def test_the_benchs_expert_counting_hears_every_fused_layer(checkpoint):
    """The bench counts experts by wrapping the store (`RoutedExperts`): the fused layers acquire
    from it between their two calls, as the unfused layers do."""
    from moetune.bench.throughput import RoutedExperts

    model = load_model(checkpoint("qwen3_moe"))
    counted = {}
    for fused in (False, True):
        routed = RoutedExperts(model)
        with routed.counting():
            calls = _decode(model, PROMPTS["three"], fused=fused, steps=4)[2]
        counted[fused] = routed.take()
        routed.detach()
        assert (calls > 0) == fused
    assert counted[True] == counted[False] > 0


def test_a_store_swapped_between_steps_is_read_afresh(ck64):
    """As the int8 benchmark does: after fused steps on fp32 experts, the model's store is replaced by
    one of int8 experts; the next steps compute with those (equal to the unfused layers on them)."""
    from moetune.experts.store import ExpertWeights, ResidentExpertStore
    from moetune.kernels.cpu import quantize_int8

    model = load_model(ck64)
    assert _decode(model, PROMPTS["three"], fused=True, steps=4)[2] > 0
    old = model.experts
    store = ResidentExpertStore({i: ExpertWeights(quantize_int8(old.weights(i).w13.data),
                                                  quantize_int8(old.weights(i).w2.data), old.weights(i).slots)
                                 for i in old.layers()})
    model.experts = store
    for layer in model.layers:
        if isinstance(layer.mlp, MoELayer):
            layer.mlp.store = store
    _assert_same(model, PROMPTS["three"], unfused_experts=False)
