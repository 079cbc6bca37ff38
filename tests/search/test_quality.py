"""Quality priced in the search (quality.py): each low-bit mix's KL / top-1 measured by `moetune eval`'s
function on the trace's model, cached in OUT/quality.json, and `--max-kl` as a constraint."""

import csv

import pytest

from moetune.bench import evaluate as ev
from moetune.search.study.optuna_study import Constraints, StudySettings
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.setup import Inputs

SPACE = ("ep_size: 1\nreplicas: 1\nplacement: contiguous\nredundant_experts: 0\nmax_num_seqs: 8\n"
         "max_num_batched_tokens: 256\noffload_resident_fraction: 1\noffload_prefetch_depth: 0\n"
         "offload_eviction: lru\nquant_low_format: [int8, int4]\nquant_hot_fraction: [0, 0.25]\n"
           "dense_format: none\nkv_format: none\noverlap: 0\n")  # and the GPU serving knobs
MAX_KL = 2e-4  # measured on the bundled model: int8 mixes <= 2e-5 nats, int4 ones 8e-4 (hot 0.25) .. 2e-3


@pytest.fixture
def count_evals(monkeypatch):
    """Counts the calls of the function behind `moetune eval` (a measured point is one call)."""
    calls = []
    real = ev.evaluate

    def counted(*args, **kwargs):
        calls.append(args[0].config.quant)
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "evaluate", counted)
    return calls


def _settings(run_dir, out, tmp_path, constraints=Constraints(max_kl=MAX_KL), quality=False, n=4, text=SPACE):
    space = tmp_path / "space.yaml"
    space.write_text(text)
    st = StudySettings("q", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", n, 0, constraints)
    return SearchSettings(Inputs(str(run_dir), "H200"), st, out, "simulate", str(space), quality=quality)


def test_max_kl_excludes_int4_measures_each_point_once_and_reuses_the_cache(run_dir, tmp_path, count_evals):
    out = tmp_path / "out"
    result = run_search(_settings(run_dir, out, tmp_path))
    assert len(count_evals) == 2  # int8, int4 at hot 0: one measurement each; the hot 0.25 mixes pruned unmeasured
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert len(rows) == 4
    for r in rows:
        if float(r["quant_hot_fraction"]) > 0:  # a GPU search: no serving engine runs a per-expert mix
            assert r["state"] == "PRUNED" and "no serving engine runs per-expert mixed formats" in r["reason"]
            continue
        kl = float(r["kl"])
        assert r["state"] == "COMPLETE" and 0 < kl and 0 < float(r["top1_agreement"]) <= 1
        if r["quant_low_format"] == "int4":
            assert kl > MAX_KL and r["feasible"] == "False"
            assert f"kl {kl:.4g} over --max-kl {MAX_KL:g}" in r["reason"]
        else:
            assert kl < MAX_KL and r["feasible"] == "True" and not r["reason"]
    assert result.winner is not None and result.winner.deployment.quant_low_format == "int8"
    cache = (out / "quality.json").read_text()
    assert cache.count('"format": "int4"') == 1 and cache.count('"format": "int8"') == 1
    report = (out / "report.md").read_text()
    assert "KL nats (measured)" in report and "Quality of each low-bit expert mix" in report

    again = tmp_path / "again"  # a second study at the same points, the cache beside it: nothing measured
    again.mkdir()
    (again / "quality.json").write_text(cache)
    count_evals.clear()
    run_search(_settings(run_dir, again, tmp_path))
    assert count_evals == []
    assert [r["kl"] for r in csv.DictReader((again / "trials.csv").open())] == [r["kl"] for r in rows]


def test_without_max_kl_or_quality_only_the_winners_mix_is_measured(run_dir, tmp_path, count_evals):
    out = tmp_path / "plain"
    mixes = SPACE.replace("quant_hot_fraction: [0, 0.25]", "quant_hot_fraction: 0")  # a GPU search runs no mix
    result = run_search(_settings(run_dir, out, tmp_path, Constraints(), n=2, text=mixes))
    assert len(count_evals) == 1 and (out / "quality.json").exists()  # the trials measured nothing
    assert result.winner.deployment.quant_low_format in ("int8", "int4")  # below fp8: measured after the study
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert rows[result.winner.number]["kl"] != "" and float(rows[result.winner.number]["kl"]) > 0


def test_a_point_without_low_format_is_kl_zero_without_running(run_dir, tmp_path, count_evals):
    from moetune.config import parse_config
    from moetune.search.cost.deployment import Deployment
    from moetune.search.study.quality import QualityLookup

    lookup = QualityLookup(parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}}), str(run_dir),
                           tmp_path / "quality.json", "cpu")
    assert lookup.quality(Deployment(quant_low_format="none")) == {"kl": 0.0, "top1_agreement": 1.0}
    assert count_evals == [] and lookup.measured == 0 and not (tmp_path / "quality.json").exists()


def test_a_winner_below_fp8_has_its_quality_measured_by_default(run_dir, tmp_path, count_evals):
    """Neither --quality nor --max-kl: the trials measure nothing, the int4 winner's mix is measured after
    the study and shown beside it (trials.csv, the report)."""
    out = tmp_path / "out"
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.replace("quant_low_format: [int8, int4]", "quant_low_format: [none, int4]")
                     .replace("quant_hot_fraction: [0, 0.25]", "quant_hot_fraction: 0"))
    st = StudySettings("q", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", 2, 0)
    result = run_search(SearchSettings(Inputs(str(run_dir), "H200", concurrency=8), st, out, "simulate", str(space)))
    assert result.winner is not None and result.winner.deployment.quant_low_format == "int4"
    assert len(count_evals) == 1  # the winner's mix only
    rows = {r["quant_low_format"]: r for r in csv.DictReader((out / "trials.csv").open())}
    assert 0 < float(rows["int4"]["kl"]) and 0 < float(rows["int4"]["top1_agreement"]) <= 1
    assert rows["none"]["kl"] == ""  # no low format: nothing measured, nothing shown
    assert "KL nats (measured)" in (out / "report.md").read_text()


def test_a_hot_mix_is_measured_with_the_hot_experts_ranked_by_the_traces_loads(run_dir, tmp_path, count_evals):
    """A hot/low mix (kept where moetune's own engine serves it) is measured once, its hot experts chosen by
    the trace's expert loads, and read from the cache the second time."""
    from moetune.config import parse_config
    from moetune.search.cost.deployment import Deployment
    from moetune.search.study.quality import QualityLookup

    lookup = QualityLookup(parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}}),
                           str(run_dir.resolve()), tmp_path / "quality.json", "cpu")
    mix = Deployment(quant_low_format="int4", quant_hot_fraction=0.25)
    first = lookup.quality(mix)
    assert 0 < first["kl"] and 0 < first["top1_agreement"] <= 1
    assert len(count_evals) == 1 and count_evals[0].hot_fraction == 0.25
    assert count_evals[0].loads == str(run_dir.resolve())
    assert lookup.quality(mix) == first and len(count_evals) == 1 and lookup.measured == 1
