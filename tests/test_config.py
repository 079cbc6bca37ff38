from pathlib import Path

import pytest

from moetune.config import RunConfig, load_recipe, parse_config
from moetune.errors import RecipeError

RECIPES = sorted((Path(__file__).parents[1] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", [p for p in RECIPES if not p.name.startswith("train-")], ids=lambda p: p.name)
def test_every_shipped_deployment_recipe_loads(path):
    assert isinstance(load_recipe(path), RunConfig)


def test_defaults_are_complete():
    cfg = RunConfig()
    assert cfg.model.path is None and cfg.parallel.ep_size == 1 and cfg.model.dtype == "auto"


@pytest.mark.parametrize("data,fragment", [
    ({"modle": {}}, "unknown key 'modle'"),
    ({"model": {"dtpye": "fp32"}}, "unknown key 'model.dtpye'"),
    ({"model": {"dtype": "fp64"}}, "model.dtype"),
    ({"parallel": {"ep_size": "four"}}, "parallel.ep_size"),
    ({"parallel": {"ep_size": 0}}, "parallel.ep_size"),
    ({"serve": {"port": 70000}}, "serve.port"),
    ({"serve": {"max_qeue": 3}}, "unknown key 'serve.max_qeue'"),
    ({"serve": {"tenants": {"a": {"expert_share": 1.5}}}}, "serve.tenants.a.expert_share"),
    ({"quant": {"experts": "int8", "table": "t.json"}}, "exactly one"),
    ({"quant": {"hot_fraction": 0.25}}, "quant.loads"),
    ({"quant": {"hot_fraction": 1.5, "loads": "r"}}, "quant.hot_fraction"),
    ({"offload": {}}, "exactly one of resident_experts"),
    ({"offload": {"resident_experts": 2, "prefetch_depth": 4}}, "offload.prefetch_depth"),
    ({"offload": {"resident_experts": 2, "policy": "fifo"}}, "offload.policy"),
    ({"engine": {"max_batch_size": 16}}, "unknown key 'engine.max_batch_size'"),
    ({"engine": {"block_size": 0}}, "engine.block_size"),
    ({"parallel": {"ep_size": 3, "ranks_per_node": 2}}, "do not tile"),
    ({"parallel": {"tp_size": 0}}, "parallel.tp_size"),
    ({"parallel": {"tp_size": 2, "expert_tp_size": 4}}, "1 or the group size 4"),
    ({"parallel": {"tp_size": 4, "expert_tp_size": 2}}, "1 or the group size 4"),
])
def test_bad_values_are_one_line_errors_naming_the_key(data, fragment):
    with pytest.raises(RecipeError) as info:
        parse_config(data)
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("par, group, world", [
    ({}, 1, 1), ({"tp_size": 2}, 2, 2), ({"expert_tp_size": 2}, 2, 2), ({"tp_size": 2, "expert_tp_size": 1}, 2, 2),
    ({"tp_size": 2, "ep_size": 3}, 2, 6),
])
def test_the_mesh_of_a_parallel_section(par, group, world):
    p = parse_config({"parallel": par}).parallel
    assert (p.group_size, p.world) == (group, world)
    assert p.expert_tp == par.get("expert_tp_size", par.get("tp_size", 1))


def test_a_missing_or_malformed_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(bad)


def test_quant_and_offload_sections_parse():
    cfg = parse_config({"quant": {"hot_fraction": 0.25, "loads": "runs/a", "high": "int8", "low": "int4-g32"},
                        "offload": {"resident_fraction": 0.5, "policy": "score", "tier": "disk", "prefetch_depth": 2}})
    assert cfg.quant.high == "int8" and cfg.offload.policy == "score" and cfg.offload.prefetch_depth == 2
