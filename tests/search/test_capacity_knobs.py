"""The capacity, scheduling and prefetch-hint knobs of the search: priced by the simulator where the
trace can say their cost (a capacity's overflow from each step's expert loads), refused by it where it
cannot (affinity scheduling, history hints, reroute), and written into the recipe a trial runs."""

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from moetune.config import load_recipe
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simmodel import SimModel
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.source import TraceSource
from moetune.search.study.optuna_study import Constraints, StudySettings
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.setup import Inputs, prepare
from tests.cli_run import moetune

FIXED = ("ep_size: 1\nreplicas: 1\nredundant_experts: 0\nplacement: contiguous\nmax_num_seqs: 8\n"
         "max_num_batched_tokens: 1024\nquant_low_format: none\nquant_hot_fraction: 0\n"
         "offload_resident_fraction: 1\noffload_prefetch_depth: 0\noffload_eviction: lru\n"
         "dense_format: none\nkv_format: none\noverlap: 0\nattn_dp: 0\nmoe_a2a: 1\nexpert_tp_size: 1\n")  # the serving engines'
# GPU knobs fixed too (the meshes among them)


def skewed_rows(rng, n: int, E: int, K: int, Lm: int, alpha: float = 0.3) -> np.ndarray:
    """[n, Lm, K] distinct experts per token, drawn from a skewed (Dirichlet α) popularity per layer."""
    skew = rng.dirichlet(np.full(E, alpha), size=Lm)
    return np.stack([np.stack([rng.choice(E, K, replace=False, p=skew[j]) for j in range(Lm)])
                     for _ in range(n)]).astype(np.int32)


def skewed_source(model: SimModel, workload: SimWorkload, seed: int = 3) -> TraceSource:
    rng = np.random.default_rng(seed)
    pre, dec = (skewed_rows(rng, n, model.E, model.K, model.Lm) for n in (160, 120))
    loads = np.stack([np.bincount(np.concatenate([pre[:, j], dec[:, j]]).ravel(), minlength=model.E)
                      for j in range(model.Lm)]).astype(np.float64)
    return TraceSource(Path("skewed"), model, pre, dec, loads, workload, batch_size=8, recorded_on="cpu",
                       model_path=None)


MODEL = SimModel("skewed", D=256, E=16, K=2, I=512, I_shared=0, L=3, moe_layers=(0, 1, 2), dense_I=(), V=2048,
                 attn_weights=256 * 4 * 256, kv_elems=2 * 2 * 64, pair_flops=4 * 4 * 64, tied=False)


@pytest.mark.parametrize("ep_size", [1, 2])
def test_drop_is_never_dearer_and_buffer_never_cheaper_than_no_capacity(ep_size):
    src = skewed_source(MODEL, SimWorkload((40, 9, 64, 17, 30, 12), 5))
    sim = Simulator(src, BUILTIN["H200"])
    base = Deployment(ep_size=ep_size, max_num_seqs=4)
    none = sim.evaluate(base)
    assert "dropped_fraction" not in none.detail and "overflow" not in none.phases_ms["decode"]
    last_drop = 1.0
    for factor in (1.0, 1.25, 1.5):
        drop = sim.evaluate(replace(base, capacity_policy="drop", capacity_factor=factor))
        buffer = sim.evaluate(replace(base, capacity_policy="buffer", capacity_factor=factor))
        assert drop.output_tok_s >= none.output_tok_s >= buffer.output_tok_s, factor
        assert drop.output_tok_s > none.output_tok_s > buffer.output_tok_s, factor  # the skew overflows
        assert 0 < drop.detail["dropped_fraction"] < last_drop  # fewer copies beyond a larger capacity
        last_drop = drop.detail["dropped_fraction"]
        assert buffer.detail["dropped_fraction"] == 0 and buffer.detail["buffered_fraction"] == last_drop
        assert buffer.phases_ms["decode"]["overflow"] > 0 and "overflow" not in drop.phases_ms["decode"]
        if ep_size > 1:  # dropped copies do not travel; buffered ones travel in the second pass
            assert drop.detail["a2a_bytes"] < none.detail["a2a_bytes"] == buffer.detail["a2a_bytes"]


def test_a_large_factor_changes_nothing_but_the_second_pass_launches():
    src = skewed_source(MODEL, SimWorkload((20, 20), 3))
    sim = Simulator(src, BUILTIN["H200"])
    none = sim.evaluate(Deployment(max_num_seqs=2))
    drop = sim.evaluate(Deployment(max_num_seqs=2, capacity_policy="drop", capacity_factor=16.0))  # C ≥ T·K
    buffer = sim.evaluate(Deployment(max_num_seqs=2, capacity_policy="buffer", capacity_factor=16.0))
    assert drop.detail["dropped_fraction"] == 0 and drop.output_tok_s == pytest.approx(none.output_tok_s, rel=1e-12)
    assert buffer.output_tok_s < none.output_tok_s  # an empty second pass still launches its kernels


def _study(run_dir, tmp_path, space: str, n: int, name: str, hw="H200", evaluator=None, constraints=Constraints()):
    path = tmp_path / f"{name}.yaml"
    path.write_text(space)
    out = tmp_path / name
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", n, 0, constraints)
    return run_search(SearchSettings(Inputs(str(run_dir), hw), st, out, "simulate", str(path)),
                      evaluator=evaluator), out


def test_a_simulated_study_over_the_capacity_knob_prices_drop_buffer_and_none_apart(run_dir, tmp_path):
    from moetune.search.study.evaluate import SimulateEvaluator

    setup = prepare(Inputs(str(run_dir), "H200"))
    sim = Simulator(skewed_source(setup.source.model, setup.workload), setup.hardware)  # the run's model
    space = FIXED + "capacity_policy: [none, drop, buffer]\ncapacity_factor: [1.0, 1.5]\n"
    result, out = _study(run_dir, tmp_path, space, 6, "cap", evaluator=SimulateEvaluator(sim, setup.workload))
    done = {(r.params["capacity_policy"], r.params["capacity_factor"]): r for r in result.rows}
    assert len(done) == 6 and all(r.state == "COMPLETE" for r in done.values())
    assert done[("none", 1.5)].reason and "factor is moot" in done[("none", 1.5)].reason  # ran as its twin
    for f in (1.0, 1.5):
        tok = {p: done[(p, f)].metrics["output_tok_s"] for p in ("none", "drop", "buffer")}
        assert tok["drop"] > tok["none"] > tok["buffer"], (f, tok)
    rows = list(csv.DictReader((out / "trials.csv").open()))
    dropped = {(r["capacity_policy"], r["capacity_factor"]): r["dropped_fraction"] for r in rows}
    assert float(dropped[("drop", "1.0")]) > float(dropped[("drop", "1.5")]) > 0 and dropped[("none", "1.0")] == ""
    assert result.winner.params["capacity_policy"] == "drop"  # the fastest: the report shows what it drops
    assert "| dropped |" in (out / "report.md").read_text()
    for engine in ("vllm", "sglang"):  # neither has a capacity flag: said, and re-priced dropless
        launch = (out / f"winner.{engine}.sh").read_text()
        assert "NOT as priced" in launch and "capacity drop at factor 1" in launch, launch


def test_the_simulated_study_refuses_what_it_cannot_price_and_says_why(run_dir, tmp_path):
    space = FIXED + "scheduling: [fcfs, affinity]\ncapacity_policy: [none, reroute]\ncapacity_factor: 1.25\n"
    result, _ = _study(run_dir, tmp_path, space, 4, "refuse")
    by = {(r.params["scheduling"], r.params["capacity_policy"]): r for r in result.rows}
    assert by[("fcfs", "none")].state == "COMPLETE"
    assert by[("affinity", "none")].state == "PRUNED" and "use --evaluator measure" in by[("affinity", "none")].reason
    assert "scheduling affinity is not priced" in by[("affinity", "none")].reason
    assert "routers' choices, not their scores" in by[("fcfs", "reroute")].reason


def test_a_winner_with_capacity_buffer_loads_and_profiles(run_dir, tmp_path):
    space = FIXED + "capacity_policy: buffer\ncapacity_factor: 1.0\nscheduling: fcfs\n"
    result, out = _study(run_dir, tmp_path, space, 1, "buffer")
    cfg = load_recipe(out / "winner.yaml")
    assert (cfg.parallel.capacity_policy, cfg.parallel.capacity_factor) == ("buffer", 1.0)
    assert "cap=buffer×1" in (out / "winner.yaml").read_text().splitlines()[0]
    got = moetune("profile", "--recipe", str(out / "winner.yaml"), "--num-requests", "2", "--batch-size", "2",
                  "--input-len", "12", "--output-len", "3", "--warmup-steps", "0", "--out", str(tmp_path / "run"))
    assert got.returncode == 0, got.stderr
    from moetune.profile.rundir import read_run

    applied = read_run(tmp_path / "run").summary["capacity_applied"]
    assert applied["policy"] == "buffer" and applied["buffered"] > 0 and applied["dropped"] == 0


def test_a_measured_study_runs_capacity_and_affinity_for_real_and_records_their_counters(run_dir, tmp_path):
    path = tmp_path / "measured.yaml"
    path.write_text(FIXED + "capacity_policy: [drop, buffer]\ncapacity_factor: 1.0\nscheduling: [fcfs, affinity]\n")
    out = tmp_path / "measured"
    st = StudySettings("m", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", 4, 0)
    result = run_search(SearchSettings(Inputs(str(run_dir), "this-machine", num_requests=4, output_len=4), st, out,
                                       "measure", str(path)))
    by = {(r.params["capacity_policy"], r.params["scheduling"]): r for r in result.rows}
    assert len(by) == 4 and all(r.state == "COMPLETE" and r.metrics["estimated"] is False for r in by.values())
    for sched in ("fcfs", "affinity"):
        drop, buffer = by[("drop", sched)].metrics["detail"], by[("buffer", sched)].metrics["detail"]
        assert 0 < drop["dropped_fraction"] < 1 and drop["buffered_fraction"] == 0
        assert 0 < buffer["buffered_fraction"] < 1 and buffer["dropped_fraction"] == 0
    assert by[("drop", "affinity")].metrics["detail"]["distinct_experts_per_step"] > 0  # the engine tracks routing
    assert "distinct_experts_per_step" not in by[("drop", "fcfs")].metrics["detail"]
    assert load_recipe(out / "winner.yaml").engine.scheduling == result.winner.params["scheduling"]


def test_max_dropped_fraction_makes_a_simulated_trial_that_drops_more_infeasible_with_the_reason(run_dir, tmp_path):
    from moetune.search.study.evaluate import SimulateEvaluator

    setup = prepare(Inputs(str(run_dir), "H200"))
    sim = Simulator(skewed_source(setup.source.model, setup.workload), setup.hardware)
    base = Deployment(max_num_seqs=8, max_num_batched_tokens=1024)
    share = {f: sim.evaluate(replace(base, capacity_policy="drop", capacity_factor=f)).detail["dropped_fraction"]
             for f in (1.0, 1.5)}
    limit = (share[1.0] + share[1.5]) / 2  # factor 1.0 drops more than the limit, 1.5 less
    space = FIXED + "capacity_policy: [drop, buffer]\ncapacity_factor: [1.0, 1.5]\n"
    _, out = _study(run_dir, tmp_path, space, 4, "maxdrop", evaluator=SimulateEvaluator(sim, setup.workload),
                    constraints=Constraints(max_dropped_fraction=limit))
    rows = {(r["capacity_policy"], r["capacity_factor"]): r for r in csv.DictReader((out / "trials.csv").open())}
    assert rows[("drop", "1.0")]["feasible"] in ("False", "false", "0")
    assert f"over --max-dropped-fraction {limit:g}" in rows[("drop", "1.0")]["reason"]
    assert rows[("drop", "1.0")]["reason"].startswith("dropped_fraction ")
    assert all(rows[k]["feasible"] in ("True", "true", "1") and not rows[k]["reason"]
               for k in (("drop", "1.5"), ("buffer", "1.0"), ("buffer", "1.5")))


def test_max_dropped_fraction_judges_a_measured_trial_by_the_engines_counters(run_dir, tmp_path):
    path = tmp_path / "measured.yaml"
    path.write_text(FIXED + "capacity_policy: [drop, buffer]\ncapacity_factor: 1.0\n")
    out = tmp_path / "measured"
    st = StudySettings("m", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", 2, 0,
                       Constraints(max_dropped_fraction=1e-6))
    result = run_search(SearchSettings(Inputs(str(run_dir), "this-machine", num_requests=2, output_len=2), st, out,
                                       "measure", str(path)))
    by = {r.params["capacity_policy"]: r for r in result.rows}
    assert by["drop"].metrics["detail"]["dropped_fraction"] > 1e-6
    rows = {r["capacity_policy"]: r for r in csv.DictReader((out / "trials.csv").open())}
    assert "over --max-dropped-fraction 1e-06" in rows["drop"]["reason"] and not rows["buffer"]["reason"]
    assert result.winner.params["capacity_policy"] == "buffer"  # the only feasible one


def test_simulate_labels_the_recipe_keys_it_prices_as_something_else(run_dir, tmp_path):
    """Through the console script: affinity, history hints and reroute are priced as fcfs, router and no
    capacity limit, and one line says so (search's simulate evaluator refuses the same keys)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {path: stdlib-moe}\nengine: {scheduling: affinity}\n"
                      "offload: {resident_fraction: 0.5, hints: history}\n"
                      "parallel: {capacity_policy: reroute, capacity_factor: 1.25}\n")
    got = moetune("simulate", "--trace", str(run_dir), "--recipe", str(recipe), "--hardware", "H100")
    assert got.returncode == 0, got.stderr
    lines = [ln for ln in got.stdout.splitlines() if "NOT as priced" in ln]
    assert len(lines) == 1, got.stdout
    for said in ("parallel.capacity_policy reroute (priced as no capacity limit)",
                 "engine.scheduling affinity (priced as fcfs)", "offload.hints history (priced as router)"):
        assert said in lines[0]
    plain = tmp_path / "plain.yaml"
    plain.write_text("model: {path: stdlib-moe}\noffload: {resident_fraction: 0.5}\n")
    got = moetune("simulate", "--trace", str(run_dir), "--recipe", str(plain), "--hardware", "H100")
    assert got.returncode == 0 and "NOT as priced" not in got.stdout, got.stderr
