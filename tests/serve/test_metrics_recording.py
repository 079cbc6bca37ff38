"""/metrics parses with prometheus-client and shows the live expert load; recording start/stop/dump
writes a run directory that `moetune report` renders."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.cli_run import moetune
from tests.serve.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _metrics(server) -> dict:
    text = httpx.get(f"{server.url}/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_parse_and_show_expert_load(server):
    server.client().completions.create(model=server.model, prompt="import sys\n", max_tokens=6, temperature=0)
    m = _metrics(server)
    for name in ("moetune_requests", "moetune_prompt_tokens", "moetune_generation_tokens",
                 "moetune_time_to_first_token_seconds", "moetune_inter_token_latency_seconds",
                 "moetune_e2e_request_latency_seconds", "moetune_queue_depth", "moetune_running_sequences",
                 "moetune_kv_blocks_used", "moetune_expert_load", "moetune_expert_balancedness",
                 "moetune_expert_imbalance", "moetune_expert_flops", "moetune_distinct_experts_per_step"):
        assert name in m, name
    spec = server.state.generator.model.spec
    distinct = {s.labels["stat"]: s.value for s in m["moetune_distinct_experts_per_step"].samples}
    assert 0 < distinct["p50"] <= distinct["max"] <= len(spec.moe_layers) * spec.moe.num_experts
    load = [s for s in m["moetune_expert_load"].samples]
    assert len(load) == len(spec.moe_layers) * spec.moe.num_experts and sum(s.value for s in load) > 0
    balance = [s.value for s in m["moetune_expert_balancedness"].samples]
    assert len(balance) == len(spec.moe_layers) and all(0 < b <= 1 for b in balance)
    ok = [s for s in m["moetune_requests"].samples
          if s.name == "moetune_requests_total" and s.labels == {"endpoint": "/v1/completions", "status": "200"}]
    assert ok and ok[0].value >= 1
    ttft = [s for s in m["moetune_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft[0].value >= 1


def test_recording_start_stop_dump_gives_a_run_dir_report_renders(server):
    post = lambda what, **kw: httpx.post(f"{server.url}/v1/expert_distribution/{what}", headers=AUTH,  # noqa: E731
                                         timeout=120, **kw)
    assert post("dump").status_code == 400  # nothing recorded yet
    assert post("start").json() == {"recording": True}
    assert post("start").status_code == 409
    client = server.client()
    for prompt in ("import os\n", "def main():\n", "class A:\n"):
        client.completions.create(model=server.model, prompt=prompt, max_tokens=6, temperature=0)
    stopped = post("stop").json()
    assert stopped["recording"] is False and stopped["steps"] >= 6
    client.completions.create(model=server.model, prompt="x", max_tokens=2)  # serving goes on after
    dumped = post("dump", json={"name": "live"}).json()
    assert dumped["path"].endswith("live") and dumped["steps"] == stopped["steps"]
    assert post("dump", json={"name": "../escape"}).status_code == 400
    from moetune.profile.rundir import read_run

    run = read_run(dumped["path"])
    assert run.trace.num_steps == stopped["steps"] and run.summary["workload"]["num_requests"] == 3
    result = moetune("report", dumped["path"], "--format", "md")
    assert result.returncode == 0, result.stderr
    assert "expert" in open(result.stdout.strip()).read().lower()
    assert _metrics(server)["moetune_expert_load"]  # the live window is back on after the recording
    assert post("start").json() == {"recording": True}
    client.completions.create(model=server.model, prompt="import os\n", max_tokens=4, temperature=0)
    taken = post("dump", json={"name": "live"})  # that run dir exists: refused before anything is written
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "run_dir_exists", taken.text
    again = post("dump", json={"name": "live-2"})  # the recording was kept for another name
    assert again.status_code == 200 and again.json()["steps"] >= 4
