"""`moetune serve` as a process: SIGTERM with requests in flight exits 0 and nothing hangs; past the
drain every request still running gets the documented 503 (a stream: an error event and [DONE]);
an engine that cannot step makes the process exit 1 for a supervisor."""

import json
import signal
import threading
import time

import httpx
import pytest

from tests.serve.conftest import ServeProcess, metric, wait_for


# `moetune serve` through the real CLI entry point, its engine's KV pool removed once built: no step can run
BROKEN = """
import sys
import moetune.serve.server as server
build = server.build_server
def broken(cfg, api_key=None):
    built = build(cfg, api_key)
    built.state.generator.engine.runner.cache = None
    return built
server.build_server = broken
from moetune.cli.main import main
sys.argv = ["moetune", *sys.argv[1:]]
main()
"""


def test_sigterm_with_requests_in_flight_exits_cleanly():
    """The signal goes once the server has admitted all four (its prompt-token counter says so); the two long
    ones (400 tokens, over a second here) are still running then, and all four finish in the 30 s drain. (A
    fixed 0.5 s wait let a request arrive after the server stopped listening on a slow minute, or let all
    four end before the signal on a fast one.)"""
    srv = ServeProcess("--max-num-seqs", "4", api_key=None)  # no key
    proc, url = srv.proc, srv.url
    try:
        outcomes = []

        def ask(max_tokens):
            try:
                r = httpx.post(f"{url}/v1/completions", timeout=60,
                               json={"prompt": "import os\n", "max_tokens": max_tokens, "ignore_eos": True})
                outcomes.append(r.status_code)
            except httpx.HTTPError as exc:  # a hang cut off by the client, or a refused connection
                outcomes.append(type(exc).__name__)

        one = httpx.post(f"{url}/v1/completions", json={"prompt": "import os\n", "max_tokens": 1}, timeout=60)
        prompt = one.json()["usage"]["prompt_tokens"]  # counted once already
        threads = [threading.Thread(target=ask, args=(n,)) for n in (8, 8, 400, 400)]
        for t in threads:
            t.start()
        assert wait_for(lambda: metric(srv.metrics(), "moetune_prompt_tokens_total") == 5 * prompt, timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
        assert outcomes == [200] * 4, outcomes  # every admitted request finishes in the drain
        assert "Traceback" not in srv.output()
    finally:
        srv.kill()


def test_sigterm_past_the_drain_gives_every_request_a_clean_503_or_final_error_event(tmp_path):
    """The signal is sent once all four are running and both streams have tokens, with a 0.25 s drain: 1,500
    tokens in a quarter second (6,000 steps/s) is out of this engine's reach, so none can finish first (a
    fixed 2 s wait and a 1 s drain let one finish normally on a fast minute)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("serve:\n  drain_timeout_s: 0.25\n")
    srv = ServeProcess("--recipe", str(recipe), "--max-num-seqs", "4", api_key=None)  # no key
    proc, url = srv.proc, srv.url
    body = {"prompt": "class Parser:\n", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
    plain, streams, started = [], [], threading.Semaphore(0)

    def ask():
        plain.append(httpx.post(f"{url}/v1/completions", json=body, timeout=120))

    def stream():
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if len(lines) == 4:
                        started.release()
            streams.append(lines)

    try:
        threads = [threading.Thread(target=f) for f in (ask, ask, stream, stream)]
        for t in threads:
            t.start()
        assert started.acquire(timeout=60) and started.acquire(timeout=60)
        assert wait_for(lambda: metric(srv.metrics(), "moetune_running_sequences") == 4, timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        for t in threads:
            t.join(timeout=30)
        assert len(plain) == 2 and len(streams) == 2
        for r in plain:
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_error", r.text
            assert "drain_timeout_s" in r.json()["error"]["message"]
        for lines in streams:
            assert lines[-1] == "[DONE]" and "error" in json.loads(lines[-2]), lines[-3:]
            assert len(lines) > 4  # it had been streaming
        stderr = srv.output()
        assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    finally:
        srv.kill()


def test_an_engine_that_cannot_step_makes_the_server_exit_1_for_a_supervisor():
    srv = ServeProcess(launcher=("-c", BROKEN), api_key=None)  # no key
    proc, url = srv.proc, srv.url
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=60)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert proc.wait(timeout=60) == 1
        last = srv.output().strip().splitlines()[-1]
        assert last.startswith("error: the engine failed (the engine could not be reset"), last
    finally:
        srv.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_second_signal_stops_at_once_with_a_clean_end_for_every_request(sig):
    """The drain would wait serve.drain_timeout_s (30 s); a second signal aborts at once: a plain
    request gets 503, a stream its error event and [DONE], no traceback, exit status 0."""
    srv = ServeProcess("--max-num-seqs", "4", api_key=None)  # no key; the default 30 s drain
    proc, url = srv.proc, srv.url
    body = {"prompt": "class Parser:\n", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
    plain, streams, started = [], [], threading.Semaphore(0)

    def ask():
        plain.append(httpx.post(f"{url}/v1/completions", json=body, timeout=120))

    def stream():
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if len(lines) == 3:
                        started.release()
            streams.append(lines)

    try:
        threads = [threading.Thread(target=f) for f in (ask, stream, stream)]
        for t in threads:
            t.start()
        assert started.acquire(timeout=60) and started.acquire(timeout=60)
        proc.send_signal(sig)
        # the first signal is handled once the socket refuses connections (a fixed 1 s wait guessed it; two
        # signals pending before the handler runs would be one)
        assert wait_for(lambda: _not_listening(url), timeout=60)
        assert proc.poll() is None  # draining: the requests would be given 30 s
        proc.send_signal(sig)
        hurried = time.monotonic()
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - hurried < 5
        for t in threads:
            t.join(timeout=30)
        assert len(plain) == 1 and len(streams) == 2
        assert plain[0].status_code == 503 and "at once" in plain[0].json()["error"]["message"], plain[0].text
        for lines in streams:
            assert lines[-1] == "[DONE]" and "at once" in json.loads(lines[-2])["error"]["message"], lines[-3:]
        stderr = srv.output()
        assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
        assert "a second signal: stopping at once" in stderr
    finally:
        srv.kill()


def _not_listening(url: str) -> bool:
    """The server's socket refuses connections (closed: the drain has begun)."""
    try:
        httpx.get(f"{url}/health", timeout=10)
    except httpx.ConnectError:
        return True
    except httpx.TransportError:  # taken just before the socket closed, then dropped: ask again
        return False
    return False
