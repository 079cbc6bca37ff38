"""A profile run with engine.speculative: the summary carries acceptance and the experts verify
steps wake against a plain decode over the measured steps, and the report shows them."""

import pytest

from moetune.config import parse_config
from moetune.profile.rundir import read_run
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.workload import Workload
from moetune.report.build import write_reports
from tests.html_check import assert_self_contained


def test_a_speculative_run_records_acceptance_and_expert_unions(tmp_path):
    cfg = parse_config({"engine": {"speculative": "ngram:3"}})  # the bundled model: code, so n-grams match
    w = Workload(num_requests=4, batch_size=2, output_len=24, warmup_steps=2)
    run = read_run(run_profile(ProfileSettings(cfg, w, out=tmp_path / "run")).path)
    s = run.summary["speculative"]
    assert s["enabled"] and s["method"] == "ngram:3"
    assert 0 < s["accepted_tokens"] <= s["draft_tokens"] <= 3 * s["verified"]
    assert s["acceptance_rate"] == s["accepted_tokens"] / s["draft_tokens"]
    assert s["expert_layers"] == s["verify_steps"] * len(run.summary["model"]["moe_layers"])
    K = run.summary["model"]["K"]
    assert s["experts_per_layer_verify"] >= s["experts_per_layer_plain"] >= K
    assert s["expert_bytes_per_step_verify"] >= s["expert_bytes_per_step_plain"] > 0
    md, = write_reports(run.path, ["md"])
    assert "ngram:3: acceptance" in md.read_text()


def test_an_mtp_run_records_acceptance_and_the_mtp_blocks_expert_reads(tmp_path):
    """The bundled model's trained MTP head: drafts accepted; its MoE block's experts are read on
    every step and counted on the verify side (bytes per step: the target's + the drafter's)."""
    cfg = parse_config({"engine": {"speculative": "mtp:1"}})
    w = Workload(num_requests=4, batch_size=2, output_len=16, warmup_steps=2)
    run = read_run(run_profile(ProfileSettings(cfg, w, out=tmp_path / "run")).path)
    s = run.summary["speculative"]
    assert s["enabled"] and s["method"] == "mtp:1" and 0 < s["accepted_tokens"] <= s["draft_tokens"] <= s["verified"]
    K = run.summary["model"]["K"]
    assert s["draft_expert_layers"] >= s["verify_steps"] > 0 and s["draft_experts_per_step"] >= K
    assert s["expert_bytes_per_step_verify"] > s["expert_bytes_per_step_draft"] > 0
    md, = write_reports(run.path, ["md"])
    assert "mtp:1: acceptance" in md.read_text() and "of which the drafter" in md.read_text()


def test_a_plain_run_says_speculation_is_off(checkpoint, tmp_path):
    cfg = parse_config({"model": {"path": str(checkpoint("qwen3_moe", shard=False))}})
    run = read_run(run_profile(ProfileSettings(cfg, Workload(num_requests=2, batch_size=2, input_len=8,
                                                             output_len=2, warmup_steps=0), out=tmp_path / "r")).path)
    assert run.summary["speculative"] == {"enabled": False}


def test_the_cli_profile_measures_speculation_per_batch_size_and_the_report_plots_it(tmp_path):
    """Through the real CLI: a speculative profile at batch 4 also decodes the first 1 and 4
    requests plainly and speculatively (interleaved); summary.json `speculative.by_batch` holds
    them, and both reports show the speed-up / expert-union figure with its table beside it."""
    import statistics

    from tests.cli_run import moetune

    run = tmp_path / "run"
    result = moetune("profile", "--speculative", "ngram:3", "--num-requests", "4", "--batch-size", "4",
                     "--output-len", "10", "--warmup-steps", "1", "--out", str(run), "--report")
    assert result.returncode == 0, result.stderr
    assert "Speculative decoding by batch size" in result.stdout
    summary = read_run(run).summary
    rows, K = summary["speculative"]["by_batch"], summary["model"]["K"]
    assert [r["batch"] for r in rows] == [1, 4]
    for r in rows:
        assert r["decode_tokens"] == r["batch"] * 9 and len(r["plain_tok_s"]) == len(r["speculative_tok_s"]) == 2
        ratios = [s / p for s, p in zip(r["speculative_tok_s"], r["plain_tok_s"])]
        assert r["speedup"] == pytest.approx(statistics.median(ratios)) and r["speedup_min"] == pytest.approx(min(ratios))
        assert 0 <= r["accepted_tokens"] <= r["draft_tokens"] <= 3 * r["verified"] and r["verify_steps"] > 0
        assert r["expert_layers"] == r["verify_steps"] * len(summary["model"]["moe_layers"])
        assert r["experts_per_layer_verify"] >= r["experts_per_layer_plain"] >= K
    assert rows[0]["experts_per_layer_plain"] == K  # one sequence's last token: exactly its top-K experts
    assert rows[1]["experts_per_layer_plain"] > K  # four sequences' tokens reach beyond one token's experts
    md = (run / "report.md").read_text()
    table = md[md.index("### Speculative decoding by batch size"):]
    assert md.index("![Speculative decoding by batch size") < md.index("### Speculative decoding by batch size")
    assert "| 1 |" in table and "| 4 |" in table and f"{rows[0]['speedup']:.2f}×" in table
    assert (run / "report_files" / "speculative.png").read_bytes().startswith(b"\x89PNG")
    html = (run / "report.html").read_text()
    figure = html[html.index("<figcaption>Speculative decoding by batch size"):]
    figure = figure[: figure.index("</figure>")]
    assert 'src="data:image/png;base64,' in figure and "<h2>Speculative decoding by batch size</h2>" in figure
    assert_self_contained(html)
    again = tmp_path / "again.md"
    assert moetune("report", str(run), "--format", "md", "--out", str(again)).returncode == 0
    assert (tmp_path / "again_files" / "speculative.png").is_file() and "| 4 |" in again.read_text()
