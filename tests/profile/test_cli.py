"""`moetune profile` and `moetune report` through the real CLI (subprocess)."""

import pytest

from tests.cli_run import assert_one_line_error, moetune, moetune_each
from tests.html_check import assert_self_contained

SMALL = ["--num-requests", "3", "--batch-size", "2", "--input-len", "12", "--output-len", "3", "--warmup-steps", "1"]


def test_profile_then_report_end_to_end(checkpoint, tmp_path):
    run = tmp_path / "run"
    result = moetune("profile", "--model", str(checkpoint("olmoe", shard=False)), *SMALL, "--ep-size", "2",
                     "--capacity-factor", "1.5", "--out", str(run), "--report")
    assert result.returncode == 0, result.stderr
    assert "Phase breakdown" in result.stdout and str(run) in result.stdout
    for name in ("recipe.yaml", "env.json", "summary.json", "phases.parquet", "expert_load.parquet",
                 "steps.parquet", "routing.npz", "report.html", "report.md"):
        assert (run / name).is_file(), name
    out, md = tmp_path / "again.html", tmp_path / "r.md"
    result, as_md = moetune_each(("report", str(run), "--out", str(out)),
                                 ("report", str(run), "--format", "md", "--out", str(md)))
    assert result.returncode == 0, result.stderr
    html = out.read_text()
    assert html.count("<img") >= 4 or "<svg" in html
    assert_self_contained(html)  # no network resources at all
    assert "Most imbalanced layers" in html and "Phase breakdown" in html
    assert "Measured per rank" in html and "Per-rank timeline" in html  # --ep-size 2 ran two ranks
    assert as_md.returncode == 0, as_md.stderr
    assert "| phase |" in md.read_text() and (tmp_path / "r_files" / "expert_load.png").is_file()


@pytest.mark.parametrize("case", ["missing", "directory", "not-json"])
def test_an_unreadable_prompts_file_is_one_line(checkpoint, tmp_path, case):
    prompts = {"missing": tmp_path / "nope.jsonl", "directory": tmp_path, "not-json": tmp_path / "bad.jsonl"}[case]
    if case == "not-json":
        prompts.write_text("{not json\n")
    result = moetune("profile", "--model", str(checkpoint("olmoe", shard=False)), "--prompts", str(prompts),
                     "--out", str(tmp_path / "run"))
    assert_one_line_error(result, str(prompts.name) if case != "directory" else "prompts")
    assert not (tmp_path / "run").exists()


def test_what_if_computes_ep_traffic_on_one_process(checkpoint, tmp_path):
    run = tmp_path / "run"
    result = moetune("profile", "--model", str(checkpoint("olmoe", shard=False)), *SMALL, "--ep-size", "3",
                     "--what-if", "--out", str(run))
    assert result.returncode == 0, result.stderr
    assert "Measured per rank" not in result.stdout and '"simulated": true' in (run / "env.json").read_text()


def test_a_bad_ep_size_is_one_line(checkpoint, tmp_path):
    result = moetune("profile", "--model", str(checkpoint("olmoe", shard=False)), "--ep-size", "4",
                     "--out", str(tmp_path / "run"))
    assert_one_line_error(result, "--ep-size 4", "6 experts")
    assert not (tmp_path / "run").exists()


def test_report_of_a_missing_run_dir_is_one_line(tmp_path):
    assert_one_line_error(moetune("report", str(tmp_path / "nope")), "nope")


def test_an_existing_run_dir_is_not_overwritten(checkpoint, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    # a workload that fits the tiny context: the default prompts (302 tokens + 64) are refused before the run dir
    result = moetune("profile", "--model", str(checkpoint("olmoe", shard=False)), *SMALL, "--out", str(run))
    assert_one_line_error(result, "already exists")
    assert [p.name for p in run.iterdir()] == ["summary.json"]


def test_env_json_says_how_the_openmp_threads_waited(checkpoint, tmp_path):
    import json

    run = tmp_path / "run"
    result = moetune("profile", "--model", str(checkpoint("olmoe", shard=False)), *SMALL, "--out", str(run))
    assert result.returncode == 0, result.stderr
    env = json.loads((run / "env.json").read_text())
    assert env["openmp_wait"] == "sleep (OMP_WAIT_POLICY=PASSIVE)"  # conftest
    assert env["malloc"] == "kept"  # the CLI keeps freed activation memory (engine/heap.py)
    assert env["decode_layers"].startswith("unfused while profiled")  # an fp32 checkpoint under the cpu backend


def test_overhead_measures_probes_switched_within_one_run(checkpoint, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one table row per line
    result = moetune("profile", "--model", str(checkpoint("olmoe", shard=False)), *SMALL, "--output-len", "20",
                     "--overhead")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "overhead on vs off, per round" in out
    assert "decode steps, switched every 8 steps" in out and "block pairs" in out
    assert "unfused layers (what a profile times) vs fused" in out  # an fp32 checkpoint under the cpu backend
