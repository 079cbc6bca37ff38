"""The `measure` evaluator on this machine (R = 1 in process, R = 2 through run_ranks), top-N
re-measure beside the estimates, and the emitted recipe: it loads, profiles and serves."""

import csv

import yaml

from moetune.config import load_recipe, parse_config
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.workload import Workload
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.setup import Inputs
from moetune.search.study.optuna_study import StudySettings

NEUTRAL = ("quant_low_format: none\nquant_hot_fraction: 0\noffload_resident_fraction: 1\n"
           "offload_prefetch_depth: 0\noffload_eviction: lru\n"
           "dense_format: none\nkv_format: none\noverlap: 0\n")  # quant, offload and the GPU serving knobs fixed
SPACE = ("redundant_experts: 0\nplacement: contiguous\nmax_num_seqs: 4\nmax_num_batched_tokens: 1024\n"
         + NEUTRAL)


def _settings(run_dir, tmp_path, evaluator, space, remeasure=0, n=2):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    out = tmp_path / "out"
    st = StudySettings("m", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", n, 0)
    return SearchSettings(Inputs(str(run_dir), "this-machine", num_requests=4, output_len=4), st, out, evaluator,
                          str(path), False, remeasure)


def test_a_measured_study_runs_one_and_two_ranks_and_its_winner_profiles(run_dir, tmp_path):
    result = run_search(_settings(run_dir, tmp_path, "measure", "ep_size: [1, 2]\n" + SPACE))
    done = [r for r in result.rows if r.state == "COMPLETE"]
    assert {r.deployment.ep_size for r in done} == {1, 2}
    assert all(r.metrics["estimated"] is False and r.metrics["output_tok_s"] > 0 for r in done)
    assert {r["figures"] for r in csv.DictReader((tmp_path / "out" / "trials.csv").open())} == {"measured"}
    # measured trials record no phases: the report's per-phase comparison is the cost model's, so labelled
    table = (tmp_path / "out" / "report.md").read_text().split("### Winner vs baseline, per step kind and phase")[1]
    table = table.split("\n### ")[0]
    assert table.startswith(" (estimated by the cost model") and "| decode | experts |" in table
    cfg = load_recipe(tmp_path / "out" / "winner.yaml")
    w = Workload(num_requests=2, batch_size=2, input_len=16, output_len=3, warmup_steps=0)
    profiled = run_profile(ProfileSettings(cfg, w, out=tmp_path / "winner-run"))
    assert profiled.summary["parallel"]["ep_size"] == cfg.parallel.ep_size


def test_top_trials_are_remeasured_beside_their_estimates_and_the_winner_serves(run_dir, tmp_path):
    import httpx

    from tests.serve.conftest import start_server

    result = run_search(_settings(run_dir, tmp_path, "simulate", "ep_size: 1\n" + SPACE, remeasure=1, n=1))
    (row, measured, error), = result.remeasured
    assert error is None and measured.estimated is False and row.metrics["estimated"] is True
    md = (tmp_path / "out" / "report.md").read_text()
    assert "estimated vs measured" in md and "(measured)" in md and "(estimated)" in md
    recipe = yaml.safe_load((tmp_path / "out" / "winner.yaml").read_text())
    recipe.pop("model")
    recipe.pop("name")
    running, stop = start_server(recipe, api_key=None)
    try:
        reply = httpx.post(f"{running.url}/v1/completions", json={"model": running.model, "prompt": "def f(",
                                                                  "max_tokens": 3, "temperature": 0}, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    finally:
        stop()
    assert parse_config(yaml.safe_load((tmp_path / "out" / "winner.yaml").read_text())).engine.max_num_seqs == 4


def test_a_measured_winner_with_two_ranks_is_served_over_two_ranks(run_dir, tmp_path):
    from tests.serve.conftest import ServeProcess, metric, wait_for

    result = run_search(_settings(run_dir, tmp_path, "measure", "ep_size: 2\n" + SPACE, n=1))
    assert [r.deployment.ep_size for r in result.rows if r.state == "COMPLETE"] == [2]
    winner = tmp_path / "out" / "winner.yaml"
    assert load_recipe(winner).parallel.ep_size == 2
    srv = ServeProcess("--recipe", str(winner), cwd=tmp_path)
    try:
        reply = srv.client().completions.create(model="stdlib-moe", prompt="def f(", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
        # rank 1 stepped with it (its report reaches rank 0 with the next exchange)
        assert wait_for(lambda: metric(srv.metrics(), "moetune_rank_lock_steps_total", rank=1) >= 3)
        assert srv.stop() == 0, srv.stderr
    finally:
        srv.kill()


def test_a_measured_study_at_tp2_runs_the_mesh_and_its_winner_serves(run_dir, tmp_path):
    """Measured trials over expert-TP alone and TP 2 (each a mesh of 2 real gloo ranks), then the
    winner's recipe served over its ranks."""
    from tests.serve.conftest import ServeProcess

    space = "ep_size: 1\ntp_size: [1, 2]\nexpert_tp_size: 2\n" + SPACE
    result = run_search(_settings(run_dir, tmp_path, "measure", space, n=2))
    done = [r for r in result.rows if r.state == "COMPLETE"]
    assert sorted((r.deployment.tp_size, r.deployment.expert_tp_size) for r in done) == [(1, 2), (2, 2)]
    assert all(r.metrics["estimated"] is False and r.metrics["output_tok_s"] > 0 for r in done)
    winner = tmp_path / "out" / "winner.yaml"
    cfg = load_recipe(winner)
    best = max(done, key=lambda r: r.metrics["output_tok_s"]).deployment
    assert (cfg.parallel.tp_size, cfg.parallel.expert_tp) == (best.tp_size, best.expert_tp_size)
    srv = ServeProcess("--recipe", str(winner), cwd=tmp_path)
    try:
        assert "2 tensor-parallel" in srv.stderr
        reply = srv.client().completions.create(model="stdlib-moe", prompt="def f(", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
        assert srv.stop() == 0, srv.stderr
    finally:
        srv.kill()


def test_a_simulated_search_over_tp_and_ep_prices_each_mesh_and_keeps_the_memory_budget(run_dir, big_config,
                                                                                      tmp_path):
    """DeepSeek-V3-shaped (scaled) on one node of 8 H100: one GPU cannot hold the experts, a TP or EP
    mesh can; pairs the engine cannot run are pruned with the reason; the winner's recipe says its mesh."""
    path = tmp_path / "space.yaml"
    path.write_text("ep_size: [1, 2, 4]\ntp_size: [1, 2, 4]\nexpert_tp_size: [1, 2, 4]\nreplicas: 1\nattn_dp: 0\nmoe_a2a: 1\n" + SPACE)
    out = tmp_path / "out"
    st = StudySettings("tp", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", 27, 0)
    inputs = Inputs(str(run_dir), "8xH100", scale_model=str(big_config), num_requests=16, input_len=128,
                    output_len=8)
    result = run_search(SearchSettings(inputs, st, out, "simulate", str(path), False, 0))
    by_point = {(r.params["ep_size"], r.params["tp_size"], r.params["expert_tp_size"]): r for r in result.rows}
    assert len(by_point) == 27  # as sampled: a point over memory is run repaired (repair.fit_memory), its reason says so
    assert "must each be 1 or the group size 4" in by_point[(1, 2, 4)].reason
    assert "= 16 ranks; the hardware has 8" in by_point[(4, 4, 4)].reason
    assert "GB per rank" in by_point[(1, 1, 1)].reason  # the experts alone are over one H100
    fits = [p for p, r in by_point.items() if r.state == "COMPLETE" and "memory:" not in (r.reason or "")]
    assert (1, 4, 4) in fits and (2, 2, 2) in fits and (4, 1, 1) in fits
    assert all(r.metrics["estimated"] for r in result.rows if r.state == "COMPLETE")
    cfg = load_recipe(out / "winner.yaml")
    w = result.winner.deployment
    assert (cfg.parallel.ep_size, cfg.parallel.tp_size, cfg.parallel.expert_tp) == (w.ep_size, w.tp_size,
                                                                                    w.expert_tp_size)
