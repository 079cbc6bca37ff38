"""Malformed HTTP through a real server: 400 for lone surrogates, deep nesting and huge integers,
431 for an oversized head, no traceback for a client that leaves during its upload, and a
non-streaming client that resets its connection frees its slot within a few engine steps."""

import socket
import time

import httpx
import pytest

from tests.serve.openai_errors import error_of as _error, logged  # noqa: F401 (a fixture)
from tests.serve.conftest import API_KEY, metric, start_server, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


@pytest.mark.parametrize("raw,words", [
    (b'{"prompt": "abc\\ud800def", "max_tokens": 2}', "surrogate"),
    (b'{"messages": [{"role": "user", "content": "abc\\udfffdef"}], "max_tokens": 2}', "surrogate"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}', "surrogate"),
    (b'{"prompt": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", "nests deeper than 32"),  # fits the 64 KiB limit
    (b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", "limited to 40 digits"),
    (b'{"prompt": "x", "seed": 18446744073709551616, "temperature": 1}', "2^63 - 1"),
    (b'{"prompt": "x", "temperature": NaN}', "finite number"),
    (b'{"prompt": "x", "top_p": Infinity}', "finite number"),
])
def test_bodies_that_were_500s_are_400_stating_the_limit(server, raw, words, logged):
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    err = _error(httpx.post(f"{server.url}{path}", content=raw, headers=AUTH, timeout=30), 400)
    assert words in err["message"]
    assert not [r for r in logged if r.exc_info]  # no traceback
    pair = b'{"prompt": "ok \\ud83d\\ude00", "max_tokens": 2}'  # a valid surrogate pair: an emoji, accepted
    ok = httpx.post(f"{server.url}/v1/completions", content=pair, headers=AUTH)
    assert ok.status_code == 200, ok.text


def test_an_oversized_header_is_431_not_a_reset(server):
    r = httpx.get(f"{server.url}/v1/models", headers={**AUTH, "X-Big": "a" * 1_000_000}, timeout=30)
    assert _error(r, 431)["code"] == "request_header_fields_too_large"
    assert httpx.get(f"{server.url}/v1/models", headers=AUTH).status_code == 200
    big_but_fine = httpx.get(f"{server.url}/v1/models", headers={**AUTH, "X-Big": "a" * 8000})
    assert big_but_fine.status_code == 200


def _answered(server, status: str) -> float:
    """How many /v1/completions requests the server has answered with `status`, by its /metrics."""
    try:
        return metric(httpx.get(f"{server.url}/metrics").text, "moetune_requests_total", endpoint="/v1/completions",
                      status=status)
    except KeyError:
        return 0.0


def test_a_client_leaving_during_its_upload_leaves_no_traceback(server, logged):
    """A body announced under the server's 64 KiB limit (100,000 bytes was refused 413 before any of it was
    read: the upload path went untested). The log is read once the server has finished with the request
    (counted: 499, or 500 had it raised); after a fixed wait the check passed without looking when the
    server was slow to get there."""
    port = int(server.url.rsplit(":", 1)[1])
    before = {s: _answered(server, s) for s in ("499", "500")}
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
                     b"\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n" + b'{"prompt": "' + b"x" * 500)
        time.sleep(0.3)  # the server may or may not have begun reading the body: it leaves during it either way
    assert wait_for(lambda: sum(_answered(server, s) - n for s, n in before.items()) >= 1)
    assert not [r for r in logged if r.exc_info or "ClientDisconnect" in r.getMessage()]
    assert _answered(server, "499") == before["499"] + 1  # "client closed request": nobody to answer
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_chat_without_max_tokens_generates_the_completions_default_of_16(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, timeout=60,
                   json={"messages": [{"role": "user", "content": "import os"}], "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16


@pytest.fixture
def two_slots():
    running, stop = start_server({"engine": {"max_num_seqs": 2}})
    yield running
    stop()


def _kv_used(server) -> float:
    line = next(x for x in httpx.get(f"{server.url}/metrics").text.splitlines() if x.startswith("moetune_kv_blocks_used "))
    return float(line.split()[1])


def test_a_non_streaming_client_reset_frees_its_slot_long_before_max_tokens(two_slots):
    """Two long non-streaming requests fill both slots; their clients reset the connection; the
    engine stops within a few steps (not at max_tokens) and a short request gets through at once."""
    engine, port = two_slots.state.generator.engine, int(two_slots.url.rsplit(":", 1)[1])
    baseline = _kv_used(two_slots)
    body = b'{"prompt": "class Parser:\\n", "max_tokens": 1500, "temperature": 0, "ignore_eos": true}'
    socks = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
                     b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        socks.append(sock)
    assert wait_for(lambda: len(engine.scheduler.running) == 2 and engine.stats.steps["decode"] > 5)
    steps_at_reset = sum(engine.stats.steps.values())
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        sock.close()
    assert wait_for(lambda: _kv_used(two_slots) == baseline and not engine.has_unfinished(), timeout=10)
    # The reset is seen when the event loop next reads the socket, between engine steps that hold the
    # GIL; on a busy machine that is a handful of steps later (7 seen in CI), never the 1,500 of max_tokens.
    assert sum(engine.stats.steps.values()) - steps_at_reset <= 60
    t = time.monotonic()
    r = httpx.post(f"{two_slots.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=AUTH, timeout=60)
    assert r.status_code == 200 and time.monotonic() - t < 10
    metrics = httpx.get(f"{two_slots.url}/metrics").text
    assert 'moetune_aborted_sequences_total{reason="client_gone"} 2.0' in metrics


def test_docs_list_the_http_cases_and_name_real_tests():
    from pathlib import Path

    from tests.serve.bad_http_doc import SECTION

    root = Path(__file__).resolve().parents[2]
    assert SECTION in (root / "docs" / "bad-input.md").read_text(), "run python -m tests.cli.write_bad_input_doc"
    named = {name.strip() for row in SECTION.splitlines() if row.startswith("| H")
             for name in row.rstrip(" |").rsplit("|", 1)[1].split(",")}
    assert named and all((root / "tests" / "serve" / f"{n}.py").is_file() for n in named), named
