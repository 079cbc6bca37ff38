"""/openapi.json describes every route with its real models, and a bounded schemathesis run against a
real server finds no server error, no answer that breaks the documented schema (issue 23), no
undocumented status or content type, and no request the schema rejects accepted (issue 41: a
string, a boolean or a fraction where an integer belongs, a chat message without content).

The server's context is 64 tokens and it holds 8 sequences, so that whatever the fuzzer asks
(`n`, `max_tokens`, long prompts) is answered quickly or refused with a 4xx."""

import json
import subprocess
import sys

import httpx
import pytest

from tests.serve.conftest import API_KEY, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ROUTES = {("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"), ("POST", "/v1/completions"),
          ("POST", "/v1/chat/completions"), ("POST", "/v1/expert_distribution/start"),
          ("POST", "/v1/expert_distribution/stop"), ("POST", "/v1/expert_distribution/dump")}

CHECKS = ("not_a_server_error,response_schema_conformance,negative_data_rejection,status_code_conformance,"
          "content_type_conformance")


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    running, stop = start_server({"engine": {"max_num_seqs": 4, "max_model_len": 64},
                                  "serve": {"max_queue": 4, "record_dir": str(tmp_path_factory.mktemp("runs"))}})
    yield running
    stop()


def test_the_document_describes_every_route_with_its_models(fuzzed):
    doc = httpx.get(f"{fuzzed.url}/openapi.json").json()  # open, like /health: no key needed
    assert {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops} == ROUTES
    schemas = doc["components"]["schemas"]
    for name in ("CompletionRequest", "ChatRequest", "CompletionResponse", "ChatCompletionResponse", "ErrorResponse"):
        assert name in schemas
    completions = doc["paths"]["/v1/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/CompletionRequest")
    assert set(completions["responses"]) >= {"200", "400", "401", "415", "429", "503"}
    assert schemas["CompletionRequest"]["properties"]["seed"]["anyOf"][0]["maximum"] == 2**63 - 1
    assert httpx.get(f"{fuzzed.url}/docs").status_code == 200


def test_fuzzing_finds_no_server_error_and_no_answer_off_the_schema(fuzzed, tmp_path):
    """schemathesis's own CLI (its pytest plugin does not load under pytest 9), positive and negative
    cases, every phase but stateful, at most 25 cases per phase and route, a fixed seed (about 45 s).
    negative_data_rejection: a request the schema rejects must get a 4xx (its default list)."""
    report = tmp_path / "run.json"
    run = subprocess.run([sys.executable, "-m", "schemathesis.cli", "run", f"{fuzzed.url}/openapi.json",
                          "--checks", CHECKS, "--max-examples", "25", "--mode", "all",
                          "--phases", "examples,coverage,fuzzing", "--seed", "23", "--request-timeout", "60",
                          "--header", f"Authorization: Bearer {API_KEY}", "--no-color",
                          "--report", "json", "--report-json-path", str(report)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:]
    cases = json.loads(report.read_text())["test_cases"]
    assert cases["generated"] >= 300 and cases["with_failures"] == 0 and cases["errored"] == 0, cases
    statuses = {}  # the server's own count of what it answered, by endpoint and status
    for line in httpx.get(f"{fuzzed.url}/metrics").text.splitlines():
        if line.startswith("moetune_requests_total{"):
            labels = dict(kv.split("=") for kv in line[line.index("{") + 1 : line.index("}")].split(","))
            statuses[(labels["endpoint"].strip('"'), labels["status"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    assert not [k for k in statuses if k[1].startswith("5")], statuses
    print(f"schemathesis: {cases['generated']} cases; answers by (endpoint, status): {sorted(statuses.items())}")
