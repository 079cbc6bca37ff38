"""Request heads through a real server: the 16 KiB limit holds however the head is split (431, an
OpenAI error object), a head not completed within serve.head_timeout_s gets 408, one address
holding hundreds of slow heads is capped at serve.slow_heads_per_client while others are answered,
and two Authorization headers are 400 (never one of them picked)."""

import json
import socket
import time

import httpx
import pytest

from tests.serve.conftest import API_KEY, ServeProcess, start_server


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _exchange(port: int, data: bytes, piece: int | None = None, pause: float = 0.0, timeout: float = 30) -> bytes:
    """Send `data` (in pieces of `piece` bytes, `pause` s apart), then read the answers until the server
    closes (a served head says `Connection: close`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        step = piece or len(data)
        try:
            for at in range(0, len(data), step):
                sock.sendall(data[at:at + step])
                time.sleep(pause)
        except OSError:  # the server answered and closed while we were still sending
            pass
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _error(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


@pytest.fixture(scope="module")
def quick():
    """A server whose heads time out after 2 s (one address: at most 3 slow heads)."""
    running, stop = start_server({"serve": {"head_timeout_s": 2, "slow_heads_per_client": 3}}, api_key=None)
    yield running
    stop()


MANY = b"".join(b"X-H%05d: v\r\n" % i for i in range(10_000))  # 10,000 small headers, ~120 KB


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\r\nHost: x\r\n" + MANY + b"\r\n",
    b"GET /health?" + b"q" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a 100 KB request line
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 16_400 + b"\r\n\r\n",  # just over, one header
], ids=["10000-headers", "100KB-request-line", "one-16.4KB-header"])
@pytest.mark.parametrize("piece", [None, 1000], ids=["at-once", "in-1KB-pieces"])
def test_a_head_over_16_KiB_is_431_however_it_is_split(quick, head, piece):
    answer = _exchange(_port(quick.url), head, piece)
    assert _status(answer) == 431, answer[:200]
    err = _error(answer)
    assert err["code"] == "request_header_fields_too_large" and "16384 bytes" in err["message"]


def test_a_head_under_the_limit_is_served_however_it_is_split(quick):
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%04d: v\r\n" % i for i in range(1200)) + b"\r\n"
    assert 14_000 < len(head) < 16_384
    last = head.replace(b"Host: x", b"Host: x\r\nConnection: close")
    for piece in (None, 1000):
        answer = _exchange(_port(quick.url), last, piece)
        assert _status(answer) == 200, answer[:200]
    # two such heads on one kept-alive connection (pipelined): each is counted alone
    answer = _exchange(_port(quick.url), head + last)
    assert answer.count(b"HTTP/1.1 200") == 2, answer[:300]


def test_a_head_not_completed_in_time_gets_408_and_a_slow_but_timely_one_is_served(quick):
    began = time.monotonic()
    answer = _exchange(_port(quick.url), b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
    took = time.monotonic() - began
    assert _status(answer) == 408 and 1.9 < took < 4.5, (answer[:200], took)
    err = _error(answer)
    assert err["code"] == "request_timeout" and "serve.head_timeout_s" in err["message"]
    # dripped over ~1.4 s: slow, but complete before the timeout
    answer = _exchange(_port(quick.url), b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       piece=9, pause=0.2)
    assert _status(answer) == 200, answer[:200]
    # a connection that never sends a byte is closed too
    with socket.create_connection(("127.0.0.1", _port(quick.url)), timeout=10) as sock:
        assert sock.recv(100).startswith(b"HTTP/1.1 408")


def test_slow_heads_from_one_address_are_capped_and_timed_out_while_others_are_answered(tmp_path):
    """600 sockets each holding half a head, through `moetune serve` (timeout 5 s, at most 100 slow
    heads per address): past the 1 s grace 500 of them get 408 at once, the other 100 at the timeout;
    requests from the same address keep being answered throughout. (Polled with deadlines: nothing
    here depends on the machine's speed but the 5 s window.)"""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("serve:\n  head_timeout_s: 5\n  slow_heads_per_client: 100\n")
    srv = ServeProcess("--recipe", str(recipe), api_key=None)
    socks: list[socket.socket] = []
    seen: dict[int, bytes] = {}
    try:
        began = time.monotonic()
        for _ in range(600):
            sock = socket.create_connection(("127.0.0.1", _port(srv.url)), timeout=10)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Slow: ")
            socks.append(sock)
        health = httpx.get(f"{srv.url}/health", timeout=10)
        assert health.status_code == 200 and health.elapsed.total_seconds() < 2
        # the first heads time out at began + 5 s: until then only the cap answers
        while len(_answered(socks, seen)) < 500 and time.monotonic() < began + 4.6:
            time.sleep(0.1)
        early = dict(seen)
        assert len(early) == 500, len(early)
        assert all(a.startswith(b"HTTP/1.1 408") and b"too many slow request heads" in a for a in early.values())
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "def f(x):\n", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200, r.text
        while len(_answered(socks, seen)) < 600 and time.monotonic() < began + 30:
            time.sleep(0.1)
        late = [a for i, a in seen.items() if i not in early]
        assert len(late) == 100 and all(a.startswith(b"HTTP/1.1 408") and b"not completed within 5 s" in a
                                        for a in late), len(late)
        assert time.monotonic() - began > 5  # the survivors held on until the timeout
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
        assert srv.stop() == 0
        assert "Traceback" not in srv.output()
    finally:
        for sock in socks:
            sock.close()
        srv.kill()


def _answered(socks: list[socket.socket], seen: dict[int, bytes]) -> dict[int, bytes]:
    """The sockets the server has answered (index → the answer's first bytes), without waiting;
    `seen` keeps what earlier calls read."""
    for i, sock in enumerate(socks):
        if i in seen:
            continue
        sock.setblocking(False)
        try:
            got = sock.recv(4096)
        except BlockingIOError:
            continue
        except OSError:  # reset after the linger
            got = b"(reset)"
        seen[i] = got or b"(closed)"
    return seen


KEY, OTHER = f"Bearer {API_KEY}", "Bearer sk-other"


@pytest.mark.parametrize("values", [(KEY, KEY), (KEY, OTHER), (OTHER, KEY)], ids=["same", "good-first", "good-last"])
def test_two_authorization_headers_are_400_whichever_holds_the_key(server, values):
    headers = [("Authorization", v) for v in values]
    r = httpx.get(f"{server.url}/v1/models", headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "duplicate_authorization" and "exactly one" in err["message"]
    assert httpx.get(f"{server.url}/v1/models", headers=[("Authorization", values[0])]).status_code in (200, 401)
    assert httpx.get(f"{server.url}/health", headers=headers).status_code == 200  # open paths read no key
