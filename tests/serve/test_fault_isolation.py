"""One bad request never harms another (issue 23), through a real server: the requests that used to
kill the engine thread or abort a whole step, a sequence failing alone beside four streams, an
engine step that fails once (reset) and an engine that cannot step any more (/health 503)."""

import json
import math
import threading
import time

import httpx
import pytest

from tests.serve.conftest import API_KEY, start_server, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _post(server, body: dict, path: str = "/v1/completions", timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=timeout)


def _stream_text(server, body: dict) -> tuple[str, list[str]]:
    """A streamed completion → (its text, the raw data lines)."""
    lines, text = [], ""
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, headers=AUTH,
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
                if line != "data: [DONE]":
                    text += "".join(c["text"] for c in json.loads(line[6:]).get("choices", []))
    return text, lines


def _gauge(server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("body,param", [
    ({"seed": 2**64, "temperature": 1}, "seed"),
    ({"seed": 2**63, "temperature": 1}, "seed"),
    ({"seed": 2**63 - 1, "n": 2, "temperature": 1}, "seed"),  # choice 1 would use 2^63
    ({"seed": -1, "temperature": 1}, "seed"),
])
def test_seeds_that_killed_the_engine_are_400_and_the_next_request_succeeds(server, body, param):
    r = _post(server, {"prompt": "def f(x):\n", "max_tokens": 4, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "2^63" in r.json()["error"]["message"] or "9223372036854775807" in r.json()["error"]["message"]
    ok = _post(server, {"prompt": "def f(x):\n", "max_tokens": 4, "seed": 2**63 - 2, "n": 2, "temperature": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
    assert server.state.worker.healthy


@pytest.mark.parametrize("sampling", [{"temperature": 1e-300}, {"temperature": 1e-40},
                                      {"temperature": 1, "top_p": 1e-300}, {"temperature": 5e-324}])
def test_extreme_but_valid_temperature_and_top_p_sample_the_most_likely_token(server, sampling):
    """The sampler is numerically safe for any finite temperature > 0 and top_p in (0, 1]: these are
    (almost) greedy, so they give the greedy tokens."""
    base = {"prompt": "import os\n", "max_tokens": 8, "ignore_eos": True}
    greedy = _post(server, {**base, "temperature": 0}).json()["choices"][0]["text"]
    r = _post(server, {**base, **sampling, "seed": 3})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == greedy


def test_one_sequence_failing_in_sampling_leaves_four_streams_complete_and_identical_to_solo(server):
    prompts = ["def read(path):\n", "class Stack:\n", "import json\n", "for i in range(3):\n"]
    base = {"max_tokens": 40, "temperature": 0, "ignore_eos": True}
    solo = [_stream_text(server, {"prompt": p, **base})[0] for p in prompts]
    results: dict = {}

    def stream(i):
        results[i] = _stream_text(server, {"prompt": prompts[i], **base})

    def victim():
        results["victim"] = _post(server, {"prompt": "x = 1\n", "max_tokens": 400, "temperature": 1, "seed": 424242,
                                           "ignore_eos": True})

    # the engine's thread waits in a call until all five are submitted, so that they start in one step: sent
    # freely, the first stream had 26 of its 40 tokens when the last arrived (two CPU hogs), and one that
    # finished before the last arrived would never be seen running beside it
    release = threading.Event()
    held = server.state.worker.call(lambda engine: release.wait(60))
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)] + [threading.Thread(target=victim)]
    for t in threads:
        t.start()
    assert wait_for(lambda: server.state.inflight == 5, timeout=60)  # all five submitted, behind the call
    release.set()
    assert held.result(10)

    def poison(engine) -> bool:
        """Once all five run: the victim's temperature becomes NaN (the only way past the edge's
        validation): its logits turn NaN and torch.multinomial raises in the next step."""
        running = engine.scheduler.running
        victim = [s for s in running if s.params.seed == 424242]
        if len(running) < 5 or not victim or any(not s.output_ids for s in running):
            return False
        object.__setattr__(victim[0].params, "temperature", math.nan)
        return True

    deadline = time.monotonic() + 60  # asked between every two steps (each call waits for the next)
    while not server.state.worker.call(poison).result(10):
        assert time.monotonic() < deadline, "the five never ran together"
    for t in threads:
        t.join(120)
    failed = results["victim"]
    assert failed.status_code == 500 and "sampling failed" in failed.json()["error"]["message"], failed.text
    for i in range(4):
        text, lines = results[i]
        assert lines[-1] == "[DONE]" and not any('"error"' in line for line in lines)
        assert text == solo[i]  # the same tokens as alone: the failure touched nobody else
    assert server.state.worker.healthy
    assert _post(server, {"prompt": "x", "max_tokens": 2}).status_code == 200


@pytest.fixture
def fresh():
    running, stop = start_server({"engine": {"max_num_seqs": 4}})
    yield running
    stop()


def test_a_step_that_fails_once_fails_its_requests_resets_the_engine_and_serving_goes_on(fresh):
    engine = fresh.state.generator.engine

    def break_next_step(engine):
        scheduler = engine.scheduler

        def schedule():
            raise RuntimeError("injected: the scheduler's state is corrupt")

        scheduler.schedule = schedule  # on this scheduler object only; reset() builds a new one

    fresh.state.worker.call(break_next_step).result(10)
    r = _post(fresh, {"prompt": "def f():\n", "max_tokens": 8})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "engine was reset" in r.json()["error"]["message"]
    assert httpx.get(f"{fresh.url}/health").json() == {"status": "ok"}
    ok = _post(fresh, {"prompt": "def f():\n", "max_tokens": 8, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8
    assert _gauge(fresh, "moetune_engine_resets") == 1 and _gauge(fresh, "moetune_engine_healthy") == 1
    assert wait_for(lambda: fresh.state.worker.snapshot.kv_blocks_used == 0 and not engine.has_unfinished())


def test_health_is_503_when_the_engine_cannot_step_and_requests_fail_fast(fresh):
    fresh.state.worker.call(lambda engine: setattr(engine.runner, "cache", None)).result(10)  # the KV pool is gone
    r = _post(fresh, {"prompt": "def f():\n", "max_tokens": 8})
    assert r.status_code == 500
    assert wait_for(lambda: not fresh.state.worker.healthy, timeout=10)
    health = httpx.get(f"{fresh.url}/health")
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    assert "could not be reset" in health.json()["reason"]
    assert _gauge(fresh, "moetune_engine_healthy") == 0
    later = _post(fresh, {"prompt": "x", "max_tokens": 2}, timeout=10)  # answered at once, not hung
    assert later.status_code == 503 and "engine has failed" in later.json()["error"]["message"]
    streamed = httpx.post(f"{fresh.url}/v1/completions", json={"prompt": "x", "stream": True}, headers=AUTH, timeout=10)
    assert streamed.status_code == 503
