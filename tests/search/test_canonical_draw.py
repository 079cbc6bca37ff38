"""The sampler draws in the canonical space: a knob that is moot given the ones drawn before it is not
drawn, a twin of a priced point spends no trial of the budget and no point is priced twice; batch
limits the engines refuse are pruned with the reason; and a GPU search given SLOs runs each trial at
the load they allow, shown in trials.csv and the trials table (through the console script)."""

import csv

import optuna
import pytest

from moetune.search.study.optuna_study import StudySettings, moot, suggest
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.setup import Inputs
from moetune.search.study.space import Deployment, Limits, build_space, prune
from tests.cli_run import moetune


def test_a_moot_knob_is_not_drawn():
    space = build_space(8, 4, priced=True)
    drawn = {k.name: k.values[0] for k in space.knobs}
    for name in ("placement", "redundant_experts", "overlap", "quant_hot_fraction", "offload_prefetch_depth",
                 "offload_eviction"):
        drawn.pop(name)
    drawn.update(ep_size=1, quant_low_format="none", offload_resident_fraction=1.0)
    d = suggest(optuna.trial.FixedTrial(drawn), space)  # a FixedTrial raises if a knob it lacks is drawn
    assert (d.placement, d.redundant_experts, d.overlap, d.quant_hot_fraction) == ("contiguous", 0, 0, 0.0)
    with pytest.raises(ValueError):  # at ep_size 2 placement matters: it is drawn
        suggest(optuna.trial.FixedTrial({**drawn, "ep_size": 2}), space)
    v = Deployment().as_dict()
    assert moot("offload_resident_fraction", {**v, "ep_size": 2}) and not moot("placement", {**v, "ep_size": 2})
    assert moot("capacity_factor", v) and not moot("capacity_factor", {**v, "capacity_policy": "drop"})


def test_no_point_is_priced_twice_and_twins_spend_no_budget(run_dir, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: [1, 2]\nreplicas: [1, 2, 4]\nredundant_experts: [0, 1, 2]\nmax_num_seqs: [8, 16]\n"
                     "max_num_batched_tokens: [256]\nquant_low_format: [none, fp8]\nquant_hot_fraction: [0, 0.5]\n"
                     "offload_resident_fraction: 1\ndense_format: none\nkv_format: none\noverlap: [0, 1]\n"
                     "attn_dp: 0\nexpert_tp_size: 1\n")  # the parallel mesh only (meshes: test_space.py)
    out = tmp_path / "out"
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput_per_gpu",), "tpe", 16, 0)
    run_search(SearchSettings(Inputs(str(run_dir), "H200", concurrency=8), st, out, "simulate", str(space)))
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{out / 'study.db'}")
    trials = study.get_trials(deepcopy=False)
    priced = [t for t in trials if t.state.name == "COMPLETE" and "reused_from" not in t.user_attrs]
    twins = [t for t in trials if t.user_attrs.get("twin")]
    counted = [t for t in trials if not t.user_attrs.get("twin") and not t.user_attrs.get("surplus")]
    keys = [t.user_attrs["canonical"] for t in priced]
    assert len(keys) == len(set(keys))  # each canonical point priced once
    assert len(counted) == 16 and twins  # the budget is 16 points; the twins came on top of it
    assert all(t.user_attrs["canonical"] in keys for t in twins)  # a twin reuses a priced point's result


def test_batch_limits_the_engines_refuse_are_pruned_with_the_reason():
    lim = Limits(8, 2, 8, 64, max_model_len=1280, chunked_prefill=False)
    assert "engines refuse it" in prune(Deployment(max_num_seqs=512, max_num_batched_tokens=256), lim)
    why = prune(Deployment(max_num_seqs=8, max_num_batched_tokens=1024), lim)
    assert "below the longest request's 1280 tokens with chunked prefill off" in why
    assert prune(Deployment(max_num_seqs=8, max_num_batched_tokens=2048), lim) is None
    chunked = Limits(8, 2, 8, 64, max_model_len=1280, chunked_prefill=True)
    assert prune(Deployment(max_num_seqs=8, max_num_batched_tokens=1024), chunked) is None


def test_a_gpu_search_given_slos_runs_each_trial_at_the_load_they_allow(run_dir, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: [1, 2]\nreplicas: 1\nmax_num_seqs: [8, 64]\nmax_num_batched_tokens: 512\n"
                     "quant_low_format: none\noffload_resident_fraction: 1\nattn_dp: 0\nexpert_tp_size: 1\n")
    out = tmp_path / "out"
    got = moetune("search", "--trace", str(run_dir), "--hardware", "H200", "--input-len", "64", "--output-len", "16",
                  "--max-ttft-ms", "3", "--max-tpot-ms", "1.5", "--n-trials", "4", "--space", str(space),
                  "--objective", "throughput_per_gpu", "--out", str(out),
                  env={"COLUMNS": "250"})  # no --concurrency; a terminal wide enough for the trials table
    assert got.returncode == 0, got.stderr
    rows = list(csv.DictReader((out / "trials.csv").open()))
    done = [r for r in rows if r["state"] == "COMPLETE"]
    assert done and all(int(r["concurrency"]) >= 1 for r in done if r["feasible"] == "True")
    assert all("the highest concurrency meeting TTFT P90 ≤ 3 ms and TPOT P90 ≤ 1.5 ms" in r["workload"] for r in done)
    assert "concurrency" in got.stdout  # the trials table's column (nothing else printed says it)
    assert "| concurrency |" in (out / "report.md").read_text()
    for r in done:  # at most the cap: max_num_seqs on each of the replica's data-parallel ranks
        assert int(r["concurrency"]) <= int(r["max_num_seqs"]) * int(r["ep_size"])


def test_a_study_whose_space_is_exhausted_stops_after_twins_in_a_row(run_dir, tmp_path):
    space = tmp_path / "space.yaml"  # two points, each with twins (placement and N are moot at ep_size 1)
    space.write_text("ep_size: 1\nreplicas: 1\nplacement: [contiguous, eplb]\nredundant_experts: [0, 1]\n"
                     "max_num_seqs: [8, 16]\nmax_num_batched_tokens: 256\nquant_low_format: none\n"
                     "offload_resident_fraction: 1\ndense_format: none\nkv_format: none\noverlap: 0\n"
                     "attn_dp: 0\nexpert_tp_size: 1\n")
    out = tmp_path / "out"
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "random", 6, 0, reference_trials=False)
    inputs = Inputs(str(run_dir), "H200", concurrency=16)  # 16 a rank: seqs 8 and 16 differ
    result = run_search(SearchSettings(inputs, st, out, "simulate", str(space)))
    priced = [r for r in result.rows if not r.twin]
    assert len(priced) == 2 and len(result.rows) - len(priced) >= 10  # stopped by the run of twins, not the budget
    assert all(r.twin for r in result.rows[-10:])
