"""The offload store's expert lifecycle (experts/offload.py): demotion after N idle steps and promotion
on use never change a token and are counted per tier; warm-up loads the most loaded experts of a
JSON loads file first."""

import json
import random

import pytest
import torch

from moetune.config import parse_config
from moetune.engine.build import build_generator, warm_loads
from moetune.engine.sampling import SamplingParams
from moetune.errors import MoetuneError, RecipeError
from moetune.experts.offload import OffloadingExpertStore, OffloadSettings
from moetune.experts.store import ExpertWeights
from moetune.model.loader import read_spec
from tests.checkpoints import VOCAB


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randint(4, 30))] for _ in range(n)]


def _generator(path, offload=None):
    data = {"model": {"path": str(path), "device": "cpu"}, "engine": {"max_num_seqs": 2}}
    if offload is not None:
        data["offload"] = offload
    return build_generator(parse_config(data))


def _tokens(gen) -> list[list[int]]:
    done = gen.generate(_prompts(5), SamplingParams(max_tokens=10, ignore_eos=True))
    return [c.token_ids for c in done]


@pytest.mark.parametrize("hints", ["router", "both"])
def test_demotion_and_promotion_never_change_tokens_and_are_counted_per_tier(checkpoint, hints):
    path = checkpoint("qwen3_moe", shard=False)
    want = _tokens(_generator(path))
    gen = _generator(path, {"resident_experts": 5, "demote_after": 1, "hints": hints})  # 5 of 7 resident
    assert _tokens(gen) == want
    gen.model.experts.drain()
    stats = gen.model.experts.stats()
    tiers = [row["tiers"] for row in stats.values()]
    assert sum(t["device"]["demotions"] for t in tiers) > 0 and sum(t["device"]["promotions"] for t in tiers) > 0
    assert all(t["device"]["resident"] <= 5 and t["host"]["reads"] >= 0 for t in tiers)
    assert sum(r["demotions"] for r in stats.values()) == sum(t["device"]["demotions"] for t in tiers)
    gen.model.experts.close()


def test_warm_up_loads_the_most_loaded_experts_of_a_json_loads_file_first(checkpoint, tmp_path):
    """The store built from the recipe's warm_start file (not through load_model, whose kernel warm-up
    runs one token through the store and may move a slot)."""
    path = checkpoint("qwen3_moe", shard=False)
    spec = read_spec(path)
    Lm, E = len(spec.moe_layers), spec.moe.num_experts
    loads = torch.rand(Lm, E, generator=torch.Generator().manual_seed(0))  # [Lm, E]
    (tmp_path / "loads.json").write_text(json.dumps(loads.tolist()))
    layers = {i: _layer_experts(E) for i in spec.moe_layers}
    warm = warm_loads(str(tmp_path / "loads.json"), list(spec.moe_layers), E)
    store = OffloadingExpertStore(layers, spec.moe.router.top_k, OffloadSettings(3, prefetch_depth=0), "cpu", warm)
    for j, layer in enumerate(store.layers()):
        store.acquire(layer, torch.argsort(loads[j], descending=True)[None, :3])  # [1, 3]: the three most loaded
        assert store.stats()[layer]["hits"] == 3 and store.stats()[layer]["misses"] == 0
    store.acquire(store.layers()[0], torch.argsort(loads[0])[None, :1])  # the least loaded: not resident
    assert store.stats()[store.layers()[0]]["misses"] == 1
    store.close()


def _layer_experts(E: int, I: int = 8, D: int = 16) -> ExpertWeights:
    g = torch.Generator().manual_seed(E)
    return ExpertWeights.dense(torch.randn(E, 2 * I, D, generator=g), torch.randn(E, D, I, generator=g))


def test_a_loads_file_of_another_shape_is_one_recipe_error(checkpoint, tmp_path):
    path = checkpoint("qwen3_moe", shard=False)
    (tmp_path / "loads.json").write_text(json.dumps([[1.0, 2.0]]))
    with pytest.raises(RecipeError, match="this model has 3 MoE layers × 7 experts"):
        _generator(path, {"resident_experts": 3, "warm_start": str(tmp_path / "loads.json")})


def test_host_to_disk_demotion_never_changes_tokens_and_is_counted_per_tier(checkpoint, tmp_path):
    """disk_after 1: idle host experts go to per-expert files and are promoted back on use (demand and
    prefetch); tokens equal the resident model's; close() leaves no file behind."""
    path = checkpoint("qwen3_moe", shard=False)
    want = _tokens(_generator(path))
    gen = _generator(path, {"resident_experts": 3, "demote_after": 1, "disk_after": 1, "dir": str(tmp_path / "d")})
    assert _tokens(gen) == want
    gen.model.experts.drain()
    tiers = [row["tiers"] for row in gen.model.experts.stats().values()]
    disk = {k: sum(t["disk"][k] for t in tiers) for k in ("writes", "reads", "bytes", "bytes_written",
                                                          "demotions", "promotions")}
    assert disk["writes"] > 0 and disk["demotions"] >= disk["writes"] and disk["reads"] == disk["promotions"] > 0
    assert disk["bytes"] > 0 and disk["bytes_written"] > 0
    assert sum(t["host"]["reads"] for t in tiers) > 0
    assert list((tmp_path / "d").glob("*.blob")) and not list((tmp_path / "d").glob("*.tmp"))
    gen.model.experts.close()
    assert not list((tmp_path / "d").iterdir())


def test_a_failed_disk_write_leaves_nothing_half_written_and_keeps_the_expert_at_host(tmp_path, monkeypatch):
    layers = {0: _layer_experts(4)}
    store = OffloadingExpertStore(layers, 1, OffloadSettings(1, prefetch_depth=0, disk_after=2, dir=str(tmp_path)))
    want = store.acquire(0, torch.tensor([[2]]))
    w2 = want.groups[0].w2.data[int(want.slots.physical(torch.tensor([[2]]))[0, 0])].clone()  # [D, I] expert 2

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", full)
    with pytest.raises(MoetuneError) as info:
        store.acquire(0, torch.tensor([[1]]))  # experts 0, 3 idle at host for two steps: written → fails
    assert "\n" not in str(info.value) and "No space left on device" in str(info.value)
    assert not list(tmp_path.iterdir())  # no .tmp, no partial .blob
    monkeypatch.undo()
    got = store.acquire(0, torch.tensor([[2]]))  # still readable (from host or disk): bit-identical
    assert torch.equal(got.groups[0].w2.data[int(got.slots.physical(torch.tensor([[2]]))[0, 0])], w2)
    store.close()


def test_disk_after_with_the_disk_tier_is_one_recipe_error(checkpoint):
    with pytest.raises(RecipeError, match="disk_after moves idle host experts to disk"):
        _generator(checkpoint("qwen3_moe", shard=False), {"resident_experts": 3, "tier": "disk", "disk_after": 2})
