"""`moetune bench-serve` against a real server: every request accounted for, figures filled in."""

import json

from moetune.bench.loadgen import LoadSettings, run_load
from moetune.profile.workload import Workload, load_prompt_texts, prompts_path
from tests.cli_run import assert_one_line_error, moetune
from tests.serve.conftest import API_KEY

TEXTS = load_prompt_texts(prompts_path(Workload()))  # the bundled held-out prompts


def test_load_at_a_concurrency_answers_everything(server):
    result = run_load(LoadSettings(server.url, num_prompts=8, concurrency=4, output_len=6, api_key=API_KEY), TEXTS)
    assert (result["answered"], result["refused"], result["lost"]) == (8, 0, 0)
    assert result["output_tokens"] == 48 and result["output_token_throughput"] > 0
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms"):
        assert 0 < result[name]["p50"] <= result[name]["p99"], name


def test_refusals_are_counted_by_status(server):
    result = run_load(LoadSettings(server.url, num_prompts=3, request_rate=50, output_len=2, api_key="sk-wrong",
                                   model=server.model), TEXTS)
    assert result["refused"] == 3 and result["failures_by_status"] == {"401": 3} and result["lost"] == 0


def test_the_cli_prints_and_writes_json(server, tmp_path):
    out = tmp_path / "load.json"
    result = moetune("bench-serve", "--url", server.url, "--api-key", API_KEY, "--num-prompts", "4",
                     "--request-rate", "20", "--output-len", "4", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "answered / refused / lost" in result.stdout and "4 / 0 / 0" in result.stdout
    written = json.loads(out.read_text())
    assert written["answered"] == 4 and written["settings"]["api_key"] == "***"


def test_an_unreachable_server_is_a_one_line_error():
    assert_one_line_error(moetune("bench-serve", "--url", "http://127.0.0.1:9", "--num-prompts", "1"),
                          "cannot reach the server")
