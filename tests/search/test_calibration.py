"""`--hardware this-machine` is calibrated on microbenchmarks taken now, not on the trace's timings:
estimates do not move when the trace's times do, the label says what the estimate was calibrated
on, the cache is kept per machine fingerprint, and the microbenchmarks are bounded. All on the
bundled model, with real engine runs (no timings are made up)."""

import json
import shutil

import pandas as pd
import pytest

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.machine_cache import CACHE_ENV, cache_dir
from moetune.search.study.one import simulate_recipe
from moetune.search.study.setup import Inputs, prepare
from tests.cli_run import moetune

TIMED = ("steps", "phases", "layers", "rank_steps", "rank_moe")  # run-dir tables with a seconds column


def slowed(run_dir, out, factor: float):
    """A copy of the run whose every recorded time is `factor`× (what a busier machine records)."""
    shutil.copytree(run_dir, out)
    for name in TIMED:
        path = out / f"{name}.parquet"
        df = pd.read_parquet(path)
        for col in [c for c in df.columns if "seconds" in c or c.endswith("_s")]:
            df[col] = df[col] * factor
        df.to_parquet(path)
    summary = json.loads((out / "summary.json").read_text())
    for kind in summary.get("kinds", {}).values():
        if "seconds" in kind:
            kind["seconds"] *= factor
    (out / "summary.json").write_text(json.dumps(summary))
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_trace_five_times_slower_gives_the_same_estimate(run_dir, tmp_path, cache):
    slow = slowed(run_dir, tmp_path / "slow", 5.0)
    d = Deployment(max_num_seqs=4)
    base = prepare(Inputs(str(run_dir), "this-machine"))
    five = prepare(Inputs(str(slow), "this-machine"))
    assert base.calibration.source == five.calibration.source == "microbenchmarks"
    a, b = base.sim.evaluate(d), five.sim.evaluate(d)
    assert a.output_tok_s == pytest.approx(b.output_tok_s, rel=1e-9)
    assert a.phases_ms["decode"]["step"] == pytest.approx(b.phases_ms["decode"]["step"], rel=1e-9)
    # the old calibration (on the trace's own times) follows the trace: this test can tell them apart
    old_a = prepare(Inputs(str(run_dir), "this-machine", calibrate_on="trace")).sim.evaluate(d)
    old_b = prepare(Inputs(str(slow), "this-machine", calibrate_on="trace")).sim.evaluate(d)
    assert old_b.output_tok_s < 0.5 * old_a.output_tok_s


def test_the_estimate_names_its_calibration(run_dir, tmp_path):
    env_cache = tmp_path / "cli-cache"
    r = moetune("simulate", "--trace", str(run_dir), "--explain", env={CACHE_ENV: str(env_cache)})
    assert r.returncode == 0, r.stderr
    assert "calibrated on microbenchmarks of this machine taken" in " ".join(r.stdout.split())
    assert "Cost model terms" in r.stdout and "experts" in r.stdout and "path (× step)" in r.stdout
    assert list((env_cache / "calibration").glob("*.json"))  # the command's cache, where the variable says
    r = moetune("simulate", "--trace", str(run_dir), "--calibrate-on", "trace", env={CACHE_ENV: str(env_cache)})
    text = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stderr
    assert "calibrated on the trace's own phase times" in text and "then" in text and "now" in text
    r = moetune("simulate", "--trace", str(run_dir), "--hardware", "H100")
    assert r.returncode == 0 and "priced on H100: NVIDIA H100 SXM datasheet" in " ".join(r.stdout.split())


def test_the_run_records_the_machine_state_its_times_were_taken_in(run_dir):
    machine = json.loads((run_dir / "env.json").read_text())["machine"]
    assert len(machine["loadavg"]) == 3 and machine["threads"] >= 1 and machine["mem_read_gbs"] > 0
    cal = prepare(Inputs(str(run_dir), "this-machine", calibrate_on="trace")).calibration
    assert cal.trace_state == machine and f"load {machine['loadavg'][0]:.1f} then" in cal.label()


def test_the_cache_is_keyed_by_machine(run_dir, cache):
    import torch

    first = prepare(Inputs(str(run_dir), "this-machine")).calibration
    assert not first.cached and cache_dir() == cache and len(list(cache.glob("calibration/*.json"))) == 1
    again = prepare(Inputs(str(run_dir), "this-machine")).calibration
    assert again.cached and again.key == first.key and again.rates == first.rates
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)  # another machine, as far as the fingerprint goes
    try:
        other = prepare(Inputs(str(run_dir), "this-machine")).calibration
    finally:
        torch.set_num_threads(threads)
    assert not other.cached and other.key != first.key and other.fingerprint["threads"] != threads
    assert len(list(cache.glob("calibration/*.json"))) == 2
    (cache / "calibration" / f"{first.key}.json").write_text("{ half")  # unreadable: measured again
    assert not prepare(Inputs(str(run_dir), "this-machine")).calibration.cached
    fresh = prepare(Inputs(str(run_dir), "this-machine", recalibrate=True)).calibration
    assert not fresh.cached and fresh.key == first.key


def test_the_microbenchmarks_are_bounded_and_take_medians(run_dir, cache):
    from moetune.search.cost.microbench import median_run, plan_for, run_bench

    setup = prepare(Inputs(str(run_dir), "this-machine"))
    cal = setup.calibration
    plan = plan_for(setup.source.workload, setup.source.batch_size)
    assert plan.min_repeats <= cal.repeats <= plan.repeats  # bounded by the plan, whatever the machine's load
    assert plan.max_steps <= 300 and plan.prompt_len == cal.plan["prompt_len"]
    assert {"k/attention/decode", "k/experts/decode", "path/decode", "unfused/decode", "step/prefill"} <= set(cal.rates)
    small = dict(prompt_len=plan.prompt_len, batches=plan.batches[:1], decodes=2, repeats=3)
    one = run_bench(setup.base, type(plan)(**small, budget_s=0.0, min_repeats=1))
    assert len(one) == 1  # the budget spent: no more repeats than the least
    runs = run_bench(setup.base, type(plan)(**small, budget_s=600.0))
    assert len(runs) == 3
    runs[1].tables.phases["seconds"] *= 100  # one repeat preempted throughout: the median ignores it
    runs[1].plain = [(k, s * 100) for k, s in runs[1].plain]
    med = median_run(runs)
    lo = pd.concat([runs[0].tables.phases.seconds, runs[2].tables.phases.seconds], axis=1).min(axis=1)
    hi = pd.concat([runs[0].tables.phases.seconds, runs[2].tables.phases.seconds], axis=1).max(axis=1)
    assert ((med.tables.phases.seconds >= lo - 1e-12) & (med.tables.phases.seconds <= hi + 1e-12)).all()
    assert len(med.plain) == len(med.unfused) == len(runs[0].plain) == 3 and med.plain[0][0] == "prefill"
    assert med.plain[1][1] <= max(runs[0].plain[1][1], runs[2].plain[1][1])


def test_explain_terms_add_up_to_the_phase_times(run_dir, cache):
    setup, d, m = simulate_recipe(Inputs(str(run_dir), "this-machine"), explain=True)
    row = setup.sim.terms[("decode", "experts")]
    n, Lm = row["n"], setup.source.model.Lm
    assert row["seconds"] == pytest.approx((row["roof_s"] + row["overhead_s"]) * row["share"] / n)  # share 1: R = 1
    assert row["roof_s"] >= max(row["compute_s"], row["memory_s"]) - 1e-15
    path = setup.calibration.path_factor("decode")
    assert 0 < path < 2  # the plain path is never much slower than the probed one
    assert 1e3 * row["seconds"] / n * Lm * path == pytest.approx(m.phases_ms["decode"]["experts"], rel=1e-6)


def test_a_calibration_taken_busy_is_measured_again_once_quiet():
    from moetune.search.cost.calibrate import busy, stale

    busy_then = {"runnable_others": 4, "time_utc": "2026-01-01T00:00:00Z"}
    quiet_then = {**busy_then, "runnable_others": 0}
    later = 1767225600.0 + 3600  # an hour after busy_then
    assert busy(busy_then, 2) and not busy(quiet_then, 2) and not busy({}, 2)
    assert stale(busy_then, 0, 2, later)  # busy then, quiet now: again
    assert not stale(busy_then, 3, 2, later)  # still busy: keep (measuring now would be no better)
    assert not stale(quiet_then, 0, 2, later)  # taken quiet: keep
    assert not stale(busy_then, 0, 2, 1767225600.0 + 10)  # just taken: keep (no loop of re-measuring)
    assert not stale(busy_then, None, 2, later)  # the state now unknown: keep


def test_a_quant_or_offload_recipe_is_calibrated_on_its_own_path(run_dir, tmp_path, cache):
    """int4 experts (with a hot fraction), int8 dense projections (quant.dense) and offloading run other
    kernels and the store's path, not the fp32 resident one the base microbenchmarks time: each is timed
    by its own microbenchmark (named in the label and in the cache entry), measured once, and still
    ignores the trace's times."""
    slow = slowed(run_dir, tmp_path / "slow", 5.0)
    recipes = {"variant/int4+hot0.25": Deployment(max_num_seqs=4, quant_low_format="int4", quant_hot_fraction=0.25),
               "variant/offload0.5-pf2-lru-router": Deployment(max_num_seqs=4, offload_resident_fraction=0.5,
                                                               offload_prefetch_depth=2),
               "variant/dense-int8": Deployment(max_num_seqs=4, dense_format="int8")}
    setup = prepare(Inputs(str(run_dir), "this-machine"))
    plain = setup.sim.evaluate(Deployment(max_num_seqs=4))
    cal = setup.calibration
    est = {key: setup.sim.evaluate(d) for key, d in recipes.items()}
    for key in recipes:
        own = cal.rates_of(key)
        assert {"decode", "prefill"} <= set(own) and all(r.value > 0 for r in own.values()), own
        assert key in cal.label()
    assert cal.timed == list(recipes) and not setup.calibration.rates_of("variant/int8")
    entry = json.loads((cache / "calibration" / f"{cal.key}.json").read_text())
    assert {f"{key}/decode" for key in recipes} <= set(entry["rates"])
    five = prepare(Inputs(str(slow), "this-machine"))  # cached: the variants are not measured again
    assert five.calibration.cached
    for key, d in recipes.items():
        assert five.sim.evaluate(d).output_tok_s == pytest.approx(est[key].output_tok_s, rel=1e-9)
    assert five.calibration.timed == []
    # the factor is applied: the variant's decode step is the fp32 one × its measured ratio
    for key in recipes:
        ratio = cal.rates_of(key)["decode"].value
        assert est[key].phases_ms["decode"]["step"] == pytest.approx(plain.phases_ms["decode"]["step"] * ratio,
                                                                     rel=0.05)


def test_a_tp_recipe_is_calibrated_on_its_own_tp_group(run_dir, cache):
    """tp_size 2 runs the engine's TP group (two one-thread processes, the all-reduces after attention and
    experts, the vocab gather), not the one-rank path the base microbenchmarks time: it is timed on its
    own (`tp/G2`: compute factor, seconds per all-reduce and per gather at the measured sizes), named in
    the label and in the cache entry, and a second setup reads the cache without measuring again."""
    d = Deployment(max_num_seqs=4, tp_size=2, expert_tp_size=2)
    setup = prepare(Inputs(str(run_dir), "this-machine"))
    est = setup.sim.evaluate(d)
    cal = setup.calibration
    own = cal.rates_of("tp/G2")
    for kind in ("decode", "prefill"):
        assert own[f"compute/{kind}"].value > 0 and own[f"allreduce/{kind}"].value > 0, own
        assert own[f"allreduce_bytes/{kind}"].value > 0 and own[f"gather/{kind}"].value > 0, own
    assert cal.timed == ["tp/G2"] and "tp/G2" in cal.label()
    entry = json.loads((cache / "calibration" / f"{cal.key}.json").read_text())
    assert {"tp/G2/compute/decode", "tp/G2/allreduce/decode"} <= set(entry["rates"])
    # the measured figures are what is priced: the step's all-reduce payload is the measured one (the
    # same buckets), so each decode all-reduce costs the measured seconds per call
    m = setup.source.model
    calls = m.L + len(m.dense_I) + m.Lm + 1  # after attention, dense MLPs and experts (split too), the embedding
    ar = est.phases_ms["decode"]["tp_allreduce"] + est.phases_ms["decode"]["tp_embed"]
    assert 0.5 < ar / (calls * own["allreduce/decode"].value * 1e3) < 2.0
    again = prepare(Inputs(str(run_dir), "this-machine"))  # cached: the TP group is not measured again
    assert again.calibration.cached and again.calibration.rates_of("tp/G2")
    assert again.sim.evaluate(d).output_tok_s == pytest.approx(est.output_tok_s, rel=1e-9)
    assert again.calibration.timed == []
