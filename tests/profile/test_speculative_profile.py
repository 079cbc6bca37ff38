"""A profile run with engine.speculative: the summary carries acceptance and the experts verify
steps wake against a plain decode over the measured steps, and the report shows them."""

from moetune.config import parse_config
from moetune.profile.rundir import read_run
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.workload import Workload
from moetune.report.build import write_reports


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
