"""`moetune search` end to end on the simulator: a study, multi-objective Pareto, grid, a failing
trial, resume after a kill, and the emitted files."""

import csv
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.config import load_recipe
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.setup import Inputs
from moetune.search.study.optuna_study import Constraints, StudySettings
from tests.cli_run import assert_one_line_error, moetune


NEUTRAL = ("quant_low_format: none\nquant_hot_fraction: 0\noffload_resident_fraction: 1\n"
           "offload_prefetch_depth: 0\noffload_eviction: lru\nreplicas: 1\n"
           "dense_format: none\nkv_format: none\noverlap: 0\n")  # quant, offload, replicas, GPU serving knobs fixed


def settings(run_dir, out: Path, hw="H200", sampler="tpe", n=12, objectives=("throughput",), space=None,
             constraints=Constraints(), what_if=False, study="s"):
    st = StudySettings(study, f"sqlite:///{out / 'study.db'}", objectives, sampler, n, 0, constraints)
    return SearchSettings(Inputs(str(run_dir), hw), st, out, "simulate", space, what_if)


def load(out: Path, study="s"):
    import optuna

    return optuna.load_study(study_name=study, storage=f"sqlite:///{out / 'study.db'}")


def test_a_simulated_study_emits_a_loadable_winner_and_its_files(run_dir, tmp_path):
    out = tmp_path / "out"
    result = run_search(settings(run_dir, out, hw="this-machine", n=14))
    assert len([r for r in result.rows if not r.twin]) == 14 and result.winner is not None  # twins: no budget
    for name in ("winner.yaml", "winner.vllm.sh", "winner.sglang.sh", "trials.csv", "pareto.csv", "report.md",
                 "report.html", "pareto.png"):
        assert (out / name).is_file(), name
    cfg = load_recipe(out / "winner.yaml")  # a recipe `moetune profile/serve --recipe` take
    assert cfg.parallel.ep_size == result.winner.deployment.ep_size
    assert "(estimated)" in (out / "winner.yaml").read_text()
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert all(r["reason"] for r in rows if r["state"] == "PRUNED")  # every pruned trial says why
    assert {r["figures"] for r in rows if r["state"] == "COMPLETE"} == {"estimated"}
    html = (out / "report.html").read_text()
    assert "The winner against the baseline" in html and "data:image/png;base64" in html and "estimated" in html
    assert "vllm serve" in (out / "winner.vllm.sh").read_text()
    assert result.calibrated_on.startswith("calibrated on microbenchmarks of this machine")
    assert result.calibrated_on in (out / "report.md").read_text()  # the report says what it was calibrated on


def test_two_objectives_give_a_pareto_front_under_constraints(run_dir, tmp_path):
    out = tmp_path / "mo"
    result = run_search(settings(run_dir, out, sampler="nsga2", n=16, objectives=("throughput", "tpot"),
                                 constraints=Constraints(max_mem_gb=100.0), what_if=True))
    front = result.front
    assert front
    for a in front:  # nobody on the front is beaten on both objectives by a feasible trial
        for b in result.ranked:
            assert not (b.values[0] > a.values[0] and b.values[1] < a.values[1])
    assert len(list(csv.DictReader((out / "pareto.csv").open()))) == len(front)


def test_grid_over_a_narrowed_space_visits_every_point_once(run_dir, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: [1, 2]\nredundant_experts: 0\nplacement: contiguous\nmax_num_seqs: [4, 8]\n"
                     "max_num_batched_tokens: 1024\n" + NEUTRAL)
    out = tmp_path / "grid"
    result = run_search(settings(run_dir, out, sampler="grid", n=4, space=str(space)))
    params = [tuple(sorted(r.params.items())) for r in result.rows]
    assert len(params) == 4 and len(set(params)) == 4


def test_the_emitted_winner_is_the_point_as_run(run_dir, tmp_path):
    """At ep_size 1 replicas and placement are moot (the trial ran as contiguous, 0 replicas): the
    recipe says so and no placement file is written for it."""
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: 1\nredundant_experts: 4\nplacement: eplb\nmax_num_seqs: 8\n"
                     "max_num_batched_tokens: 1024\n" + NEUTRAL)
    out = tmp_path / "moot"
    result = run_search(settings(run_dir, out, sampler="grid", n=1, space=str(space)))
    assert result.winner.params["placement"] == "eplb" and result.winner.params["redundant_experts"] == 4
    cfg = load_recipe(out / "winner.yaml")
    assert (cfg.parallel.placement, cfg.parallel.redundant_experts) == ("contiguous", 0)
    assert not (out / "winner.placement.json").exists()


class Failing:
    """The simulator, except that every ep_size 2 trial raises (a crash, an OOM)."""

    def __init__(self, inner):
        self.inner, self.name = inner, "simulate"

    def check(self, d):
        return self.inner.check(d)

    def memory_rule(self):
        return self.inner.memory_rule()

    def evaluate(self, d):
        if d.ep_size == 2:
            raise RuntimeError("CUDA out of memory (injected)")
        return self.inner.evaluate(d)


def test_a_failing_trial_is_recorded_with_its_reason_and_the_study_goes_on(run_dir, tmp_path):
    from moetune.search.study.evaluate import SimulateEvaluator
    from moetune.search.study.setup import prepare

    s = settings(run_dir, tmp_path / "fail", sampler="grid", n=8,
                 space=_space(tmp_path, "ep_size: [1, 2]\nredundant_experts: 0\nplacement: contiguous\n"
                                        "max_num_seqs: [2, 4]\nmax_num_batched_tokens: [512, 1024]\n" + NEUTRAL))
    setup = prepare(s.inputs)
    result = run_search(s, evaluator=Failing(SimulateEvaluator(setup.sim, setup.workload)))
    failed = [r for r in result.rows if r.state == "FAIL"]
    assert len(failed) == 4 and all("out of memory (injected)" in r.reason for r in failed)
    assert result.winner is not None and result.winner.deployment.ep_size == 1
    assert "FAIL" in (tmp_path / "fail" / "trials.csv").read_text()


def _space(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


def test_killed_mid_study_the_same_command_finishes_it_without_losing_or_repeating_a_trial(run_dir, tmp_path):
    import optuna

    out = tmp_path / "resume"
    n = 24
    space = tmp_path / "space.yaml"
    space.write_text("replicas: 1\n")  # no trial lost to an invalid replicas × ep_size pair: the study lasts
    cmd = [sys.executable, "-m", "moetune", "search", "--trace", str(run_dir), "--hardware", "H200",
           "--study", "r", "--n-trials", str(n), "--num-requests", "256", "--output-len", "48", "--grace-s", "2",
           "--space", str(space), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        try:
            trials = load(out, "r").get_trials(deepcopy=False)
        except Exception:  # the study is not created yet
            continue
        done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
        running = any(t.state == optuna.trial.TrialState.RUNNING for t in trials)
        if done >= 3 and running:
            break
    assert proc.poll() is None, f"the study ended before it could be killed: {proc.stderr.read().decode()[-500:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = load(out, "r").get_trials(deepcopy=False)
    killed = [t for t in before if t.state == optuna.trial.TrialState.RUNNING]
    assert len(killed) <= 1 and len(before) < n  # killed inside a trial (or, rarely, between two)
    time.sleep(3)  # past the grace period: the dead worker's trial is stale
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    trials = load(out, "r").get_trials(deepcopy=False)
    from moetune.search.study.optuna_study import retried_number

    retried = {retried_number(t): t for t in trials}
    stale = killed[0].number if killed else -1
    dump = [(t.number, t.state.name, t.params, dict(t.user_attrs), {k: v for k, v in t.system_attrs.items()
             if k in ("failed_trial", "fixed_params")}) for t in trials]
    if killed and killed[0].params:  # killed after choosing (part of) its point: that point is run again
        assert stale in retried, (stale, killed[0].params, dump)
        chosen = retried[stale].params  # the knobs the dead trial had chosen keep their values
        assert all(chosen.get(k) == v for k, v in killed[0].params.items()), (stale, killed[0].params, dump)
    elif killed and stale in retried:  # killed before choosing a point: nothing to run again (it does not
        # count). Optuna's own retry callback may still queue a copy of a trial that had a heartbeat;
        # with no point fixed, that copy chooses one of its own like any new trial (seen in a CI run).
        # A seeded trial's point was fixed when it was queued: its copy runs that same seed (seen in CI)
        own = killed[0].system_attrs.get("fixed_params")
        assert retried[stale].system_attrs.get("fixed_params") in (None, {}, own), (stale, own, dump)
    counted = [t for t in trials if t.number != stale and not t.user_attrs.get("surplus")
               and not t.user_attrs.get("twin")  # a twin of a priced point spends no budget
               and not (t.state.name == "FAIL" and "fail_reason" not in t.user_attrs)]
    assert len(counted) == n
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in trials)
    finished = [t for t in before if t.state == optuna.trial.TrialState.COMPLETE]
    evaluated_again = [t for t in trials if t.number > max(f.number for f in finished) and t.state.name == "COMPLETE"
                       and "reused_from" not in t.user_attrs and any(t.params == f.params for f in finished)]
    assert not evaluated_again  # a finished point is never evaluated again


def test_a_worker_that_died_before_its_first_heartbeat_does_not_hold_the_study(run_dir, tmp_path):
    """A worker killed between creating its trial and starting the heartbeat thread (Optuna samples
    in between) leaves a RUNNING trial without a heartbeat, which Optuna's stale check skips."""
    import optuna

    out = tmp_path / "silent"
    space = tmp_path / "space.yaml"
    space.write_text("replicas: 1\n")  # three trials: none lost to an invalid replicas × ep_size pair
    first = settings(run_dir, out, n=3, space=str(space))
    run_search(first)
    study = load(out)
    point = next(t.params for t in study.get_trials() if t.state.name == "COMPLETE")
    empty = study.ask()  # died before it chose a point: failed, not counted, nothing to re-run
    study.enqueue_trial(point)
    queued = study.ask()  # a queued point that died before suggesting it: failed and re-queued
    assert queued.number > empty.number and not study.trials[queued.number].params
    time.sleep(1.2)
    again = settings(run_dir, out, n=6, space=str(space))
    again = replace(again, study=replace(again.study, heartbeat_s=1, grace_s=1))
    run_search(again)
    trials = load(out).get_trials(deepcopy=False)
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in trials)
    assert trials[empty.number].state.name == "FAIL" and trials[queued.number].state.name == "FAIL"
    from moetune.search.study.optuna_study import retried_number

    rerun = [t for t in trials if retried_number(t) == queued.number]
    assert len(rerun) == 1 and rerun[0].params == point and rerun[0].state.name == "COMPLETE"
    assert not any(retried_number(t) == empty.number for t in trials)
    counted = [t for t in trials if t.number not in (empty.number, queued.number) and not t.user_attrs.get("surplus")
               and not t.user_attrs.get("twin")]
    assert len(counted) == 6


def test_search_user_mistakes_are_one_line(run_dir, tmp_path):
    base = ["search", "--trace", str(run_dir), "--out", str(tmp_path / "o"), "--hardware", "H100"]
    assert_one_line_error(moetune(*base, "--sampler", "cmaes"), "--sampler 'cmaes'")
    assert_one_line_error(moetune(*base, "--objective", "speed"), "--objective 'speed'")
    assert_one_line_error(moetune(*base, "--evaluator", "measure"), "--hardware this-machine")
    space = tmp_path / "space.yaml"
    space.write_text("warp: 3\n")
    assert_one_line_error(moetune(*base, "--space", str(space)), "unknown knob 'warp'")
    assert_one_line_error(moetune(*base, "--storage", "nosuchdb://x"), "--storage")
