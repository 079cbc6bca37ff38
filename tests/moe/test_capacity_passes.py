"""A capacity limit in the MoE layer (moe/passes.py): `buffer` computes the copies beyond capacity in a
second pass of the same step and gives the logits of no limit, where `drop` changes them; `drop`
computes only the copies within capacity."""

import pytest
import torch

from moetune.config import parse_config
from moetune.engine.build import build_generator, capacity_counts
from moetune.moe.layer import MoELayer

PROMPT = torch.randint(3, 300, (24,), generator=torch.Generator().manual_seed(1)).tolist()


def _generator(path, backend, policy, factor=1.0):
    parallel = {} if policy == "none" else {"capacity_factor": factor, "capacity_policy": policy}
    return build_generator(parse_config({"model": {"path": str(path), "device": "cpu", "kernel_backend": backend},
                                         "parallel": parallel}))


def _logits(gen) -> torch.Tensor:
    return gen.model.logits(gen.engine.runner.forward_prompts([PROMPT]))  # [T, V]


def _count_expert_rows(model) -> list[int]:
    """Every experts-phase call's row count, over all MoE layers (which may share one backend)."""
    rows = []
    backends = {id(layer.mlp.backend): layer.mlp.backend for layer in model.layers if isinstance(layer.mlp, MoELayer)}
    for backend in backends.values():
        inner = backend.experts

        def counted(x, offsets, weights, inner=inner):
            rows.append(x.shape[0])
            return inner(x, offsets, weights)

        backend.experts = counted
    return rows


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "deepseek_v3"])
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_buffer_gives_the_logits_of_no_limit_where_drop_changes_them(checkpoint, model_type, backend):
    path = checkpoint(model_type, shard=False)
    want = _logits(_generator(path, backend, "none"))
    drop_gen, buffer_gen = _generator(path, backend, "drop"), _generator(path, backend, "buffer")
    dropped, buffered = _logits(drop_gen), _logits(buffer_gen)
    assert capacity_counts(drop_gen.model)["dropped"] > 0  # the layer limit bites at factor 1.0
    assert capacity_counts(buffer_gen.model)["buffered"] > 0  # (after the first layer the two route apart)
    assert (dropped - want).abs().max() > 1e-3
    torch.testing.assert_close(buffered, want, rtol=0, atol=1e-5)


def test_drop_computes_only_the_copies_within_capacity_and_buffer_all(checkpoint):
    path = checkpoint("mixtral", shard=False)
    T, K = len(PROMPT), 2
    for policy in ("none", "drop", "buffer"):
        gen = _generator(path, "torch", policy)
        rows = _count_expert_rows(gen.model)
        _logits(gen)
        moe_layers = sum(isinstance(layer.mlp, MoELayer) for layer in gen.model.layers)
        counts = capacity_counts(gen.model)
        assert sum(rows) == moe_layers * T * K - counts["dropped"]
        if policy == "buffer":
            assert len(rows) == 2 * moe_layers and counts["buffered"] > 0  # two passes per layer
        if policy == "drop":
            assert counts["dropped"] > 0 and len(rows) == moe_layers


def test_a_factor_that_never_binds_changes_nothing(checkpoint):
    path = checkpoint("qwen3_moe", shard=False)
    want = _logits(_generator(path, "torch", "none"))
    for policy in ("drop", "buffer"):
        gen = _generator(path, "torch", policy, factor=100.0)
        torch.testing.assert_close(_logits(gen), want, rtol=0, atol=1e-6)
        assert capacity_counts(gen.model) == {"dropped": 0, "rerouted": 0, "buffered": 0}
