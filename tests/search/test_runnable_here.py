"""A search on this machine proposes only what this machine's kernel backend computes (expert formats,
and the dense projections' int8 / int4: machine_space.py), and its winner serves: `moetune serve
--recipe winner.yaml` answers a request."""

import pytest

from moetune.search.study.optuna_study import StudySettings
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.setup import Inputs
from moetune.search.study.machine_space import machine_space
from moetune.search.study.space import SpaceError, build_space

FIXED = ("ep_size: 1\nreplicas: 1\nredundant_experts: 0\nplacement: contiguous\nmax_num_seqs: 8\n"
         "max_num_batched_tokens: 1024\nquant_hot_fraction: 0\noffload_resident_fraction: 1\n"
         "offload_prefetch_depth: 0\noffload_eviction: lru\n")


def _search(run_dir, tmp_path, space: str, n: int, name="out"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(space)
    out = tmp_path / name
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", n, 0)
    return run_search(SearchSettings(Inputs(str(run_dir), "this-machine"), st, out, "simulate", str(path))), out


def test_a_this_machine_search_never_proposes_a_format_the_cpu_backend_lacks(run_dir, tmp_path):
    import optuna

    result, out = _search(run_dir, tmp_path, FIXED, n=3)
    assert {r.params["quant_low_format"] for r in result.rows} == {"none", "int8", "int4"}
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{out / 'study.db'}")
    choices = study.trials[0].distributions["quant_low_format"].choices
    assert tuple(choices) == ("none", "int8", "int4")  # fp8 has no CPU kernel: not in the space at all


def test_a_space_that_names_a_format_this_backend_lacks_is_refused_in_one_line(run_dir, tmp_path):
    with pytest.raises(SpaceError, match="quant_low_format fp8: this machine's kernel backend 'cpu' cannot"):
        _search(run_dir, tmp_path, FIXED + "quant_low_format: [none, fp8]\n", n=2, name="fp8")


def _serves(winner, tmp_path) -> None:
    from tests.serve.conftest import ServeProcess

    srv = ServeProcess("--recipe", str(winner), cwd=tmp_path)
    try:
        reply = srv.client().completions.create(model="stdlib-moe", prompt="def f(", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
        assert srv.stop() == 0, srv.stderr
    finally:
        srv.kill()


def test_a_this_machine_winner_with_low_bit_experts_serves(run_dir, tmp_path):
    from moetune.config import load_recipe

    _, out = _search(run_dir, tmp_path, FIXED + "quant_low_format: int4\n", n=1, name="int4")
    assert load_recipe(out / "winner.yaml").quant.experts == "int4-g64"
    _serves(out / "winner.yaml", tmp_path)


def test_the_dense_projections_format_is_a_this_machine_knob_of_what_the_backend_runs():
    grid = lambda *a: machine_space(build_space(16, 2, priced=False), "cpu", False, *a).grid()  # noqa: E731
    assert "dense_format" not in grid() and "fp8" not in grid()["quant_low_format"]  # not named: the base's none
    assert grid(None, "int8")["dense_format"] == ["int8"]  # not named: the base recipe's quant.dense
    assert grid(["none", "int8", "int4"])["dense_format"] == ["none", "int8", "int4"]
    with pytest.raises(SpaceError, match="dense_format fp8: this machine's kernel backend 'cpu' runs none, int8, int4"):
        machine_space(build_space(16, 2, priced=False), "cpu", False, ["none", "fp8"])


def test_a_this_machine_dense_int8_winner_is_priced_on_its_own_path_and_serves(run_dir, tmp_path):
    """dense_format int8 → the recipe's quant.dense; the simulator times that path (a variant of its
    own, measured against the fp32 model) and the emitted winner.yaml serves."""
    from moetune.config import load_recipe
    from moetune.search.cost.deployment import Deployment
    from moetune.search.study.setup import prepare

    result, out = _search(run_dir, tmp_path, FIXED + "dense_format: int8\nquant_low_format: none\n", n=1,
                          name="dense")
    cfg = load_recipe(out / "winner.yaml")
    assert cfg.quant.dense == "int8" and cfg.quant.experts is None
    assert {r.params["dense_format"] for r in result.rows} == {"int8"}
    sim = prepare(Inputs(str(run_dir), "this-machine")).sim
    own = sim.own_path(Deployment(max_num_seqs=8, dense_format="int8"))
    assert own is not None and own[0] == "variant" and own[1]  # its measured ratio per step kind
    int8, fp32 = (sim.memory(Deployment(max_num_seqs=8, dense_format=f)) for f in ("int8", "none"))
    assert int8.dense < fp32.dense  # held at int8 bytes
    _serves(out / "winner.yaml", tmp_path)
