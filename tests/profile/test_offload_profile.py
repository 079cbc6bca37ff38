"""A profile run with a recipe's quant and offload sections: expert loads stay logical, the summary
carries the offload counters per layer, and the report shows them."""

from moetune.config import parse_config
from moetune.profile.rundir import read_run
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.workload import Workload
from moetune.report.build import write_reports

WORKLOAD = Workload(num_requests=4, batch_size=2, input_len=16, output_len=6, warmup_steps=1)


def test_offloaded_quantized_run_records_hit_rates_and_renders_them(checkpoint, tmp_path):
    ck = checkpoint("qwen3_moe", shard=False)  # E = 7, K = 3, 3 MoE layers
    cfg = parse_config({"model": {"path": str(ck)}, "quant": {"experts": "int8"},
                        "offload": {"resident_experts": 4, "policy": "score", "prefetch_depth": 2}})
    run = read_run(run_profile(ProfileSettings(cfg, WORKLOAD, out=tmp_path / "run")).path)
    off = run.summary["offload"]
    assert off["enabled"] and set(off["layers"]) == {"0", "1", "2"}
    for row in off["layers"].values():
        assert 0 <= row["hit_rate"] <= 1 and row["capacity"] == 4 and row["hits"] + row["misses"] > 0
    assert off["total"]["bytes_host"] > 0
    load = run.tables.expert_load
    assert set(load.expert) == set(range(7))  # logical experts, not cache slots
    steps = run.tables.steps
    assert load.groupby("step").tokens.sum().sort_index().tolist() == (steps.sort_values("step").tokens * 3 * 3).tolist()
    md, = write_reports(run.path, ["md"])
    text = md.read_text()
    assert "Expert offloading" in text and "offload.png" in text


def test_a_resident_run_says_offload_is_off(checkpoint, tmp_path):
    cfg = parse_config({"model": {"path": str(checkpoint("qwen3_moe", shard=False))}})
    run = read_run(run_profile(ProfileSettings(cfg, Workload(num_requests=2, batch_size=2, input_len=8,
                                                             output_len=2, warmup_steps=0), out=tmp_path / "r")).path)
    assert run.summary["offload"] == {"enabled": False}
