"""The slot gate (serve/fairness.py) alone, and a fan-out request through a real server.

Alone: a request and a tenant never hold more than their caps, choices go out once each and in
order, a blocked request does not block those behind it, and the gate is work-conserving within
the caps (random runs checked against those invariants). Through the server: while a request with
n=64 runs, an 8-token request's time to first token stays near what it is alone, and it finishes
while the fan-out still runs (it no longer waits for one of the 64 to finish); a tenant's requests
together hold at most its slot_share, and another tenant's request passes them.
"""

import random
import statistics
import threading
import time

import httpx
import pytest

from moetune.config import ServeConfig, TenantConfig
from moetune.serve.fairness import SlotGate, share_cap
from moetune.serve.worker import Stream
from tests.serve.conftest import start_server


def _stream(n: int, tenant: str = "") -> Stream:
    return Stream([[1]] * n, [None] * n, loop=None, tenant=tenant)


def test_share_cap_rounds_down_and_keeps_one():
    assert [share_cap(0.5, 64), share_cap(0.3, 10), share_cap(1.0, 3), share_cap(0.01, 8)] == [32, 3, 3, 1]
    gate = SlotGate.of(ServeConfig(max_request_share=0.25, tenants={"a": TenantConfig(slot_share=0.5),
                                                                    "b": TenantConfig(tokens_per_s=5)}), 16)
    assert gate.request_cap == 4 and gate.tenant_caps == {"a": 8}


def test_a_request_gets_its_cap_and_the_rest_as_its_sequences_finish():
    gate = SlotGate(request_cap=2)
    big, short = _stream(5), _stream(1)
    gate.offer(big)
    gate.offer(short)
    assert [(s is big, i) for s, i in gate.take()] == [(True, 0), (True, 1), (False, 0)]
    assert gate.take() == [] and gate.pending == 3
    gate.finished(big)
    assert [i for _, i in gate.take()] == [2]
    gate.finished(big)
    gate.finished(big)
    assert [i for _, i in gate.take()] == [3, 4] and gate.pending == 0
    gate.forget(big)
    gate.finished(short)
    assert gate.take() == [] and not gate.streams()


def test_a_tenant_is_capped_across_its_requests_and_others_pass():
    gate = SlotGate(request_cap=10, tenant_caps={"t": 3})
    a, b, c = _stream(2, "t"), _stream(2, "t"), _stream(1, "u")
    for s in (a, b, c):
        gate.offer(s)
    assert [(s.tenant, i) for s, i in gate.take()] == [("t", 0), ("t", 1), ("t", 0), ("u", 0)]
    gate.forget(a)  # aborted: its two slots are free again
    assert [(s is b, i) for s, i in gate.take()] == [(True, 1)]
    assert gate.streams() == []


@pytest.mark.parametrize("seed", range(20))
def test_random_runs_keep_the_caps_and_leave_no_slot_idle(seed):
    rng = random.Random(seed)
    req_cap, caps = rng.randint(1, 4), {"a": rng.randint(1, 5), "b": rng.randint(1, 3)}
    gate = SlotGate(req_cap, caps)
    held: dict[int, list[int]] = {}  # id → choices in the engine
    given: dict[int, list[int]] = {}
    streams: dict[int, Stream] = {}
    for _ in range(300):
        op = rng.random()
        if op < 0.3:
            s = _stream(rng.randint(1, 7), rng.choice(["a", "b", ""]))
            streams[id(s)], held[id(s)], given[id(s)] = s, [], []
            gate.offer(s)
        elif op < 0.8 and any(held.values()):
            key = rng.choice([k for k, v in held.items() if v])
            held[key].pop(0)
            gate.finished(streams[key])
        elif op < 0.85 and streams:
            key = rng.choice(list(streams))
            gate.forget(streams.pop(key))
            held.pop(key), given.pop(key)
        for s, i in gate.take():
            held[id(s)].append(i)
            given[id(s)].append(i)
        for key, s in streams.items():  # the caps hold; choices go once each, in order
            assert len(held[key]) <= req_cap and given[key] == list(range(len(given[key])))
        tenant_held = {t: sum(len(held[k]) for k, s in streams.items() if s.tenant == t) for t in caps}
        assert all(tenant_held[t] <= caps[t] for t in caps)
        for key, s in streams.items():  # nothing waits that the caps would let through
            if len(given[key]) < len(s.prompts):
                assert len(held[key]) == req_cap or tenant_held.get(s.tenant, -1) == caps.get(s.tenant), (key, s)
        assert gate.pending == sum(len(s.prompts) - len(given[k]) for k, s in streams.items())


def _first_token_s(url: str, max_tokens: int = 8) -> tuple[float, float]:
    """(time to the first streamed token, to the end) of a short greedy request."""
    began = time.monotonic()
    first = None
    body = {"prompt": "def add(a, b):\n", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"text"' in line:
                first = time.monotonic() - began
    return first, time.monotonic() - began


def test_a_fan_out_request_leaves_room_for_a_short_one():
    """64 running slots, n=64: the fan-out holds at most half (serve.max_request_share 0.5), so an
    8-token request sent while it runs starts at once. Generous bound on its TTFT: 10 × its solo TTFT
    + 1 s (measured in this test); the structural check: it ends before the fan-out does."""
    running, stop = start_server({"engine": {"max_num_seqs": 64}, "serve": {"max_queue": 64}}, api_key=None)
    try:
        solo = statistics.median(_first_token_s(running.url)[0] for _ in range(3))
        fan: dict = {}

        def fan_out():
            fan["r"] = httpx.post(f"{running.url}/v1/completions", timeout=600, json={
                "prompt": "class Tree:\n", "n": 64, "max_tokens": 48, "temperature": 1.0, "seed": 1,
                "ignore_eos": True})
            fan["end"] = time.monotonic()

        thread = threading.Thread(target=fan_out)
        thread.start()
        assert _wait(lambda: running.state.worker.snapshot.running >= 32)
        assert running.state.worker.snapshot.running == 32  # half the slots, the rest waits at the gate
        ttft, took = _first_token_s(running.url)
        short_end = time.monotonic()
        thread.join(600)
        assert fan["r"].status_code == 200 and len(fan["r"].json()["choices"]) == 64
        assert short_end < fan["end"], "the short request waited for the fan-out"
        assert ttft < 10 * solo + 1.0, (ttft, solo)
    finally:
        stop()


def _wait(predicate, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_a_tenant_holds_at_most_its_slot_share_over_all_its_requests():
    """8 running slots, tenant "batch" slot_share 0.25: its three n=2 requests run two sequences at a
    time between them, and a request of another tenant sent meanwhile starts at once and ends first."""
    running, stop = start_server({"engine": {"max_num_seqs": 8},
                                  "serve": {"max_request_share": 1.0, "tenants": {"batch": {"slot_share": 0.25}}}},
                                 api_key=None)
    peak, ends, answers = [], {}, []
    body = {"prompt": "import os\n", "n": 2, "max_tokens": 120, "temperature": 0, "ignore_eos": True}

    def batch(i):
        answers.append(httpx.post(f"{running.url}/v1/completions", json=body, headers={"X-Tenant": "batch"},
                                  timeout=300))
        ends[i] = time.monotonic()

    try:
        threads = [threading.Thread(target=batch, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        assert _wait(lambda: running.state.inflight == 6)  # all three in (the first still running)
        while len(peak) < 20:
            peak.append(running.state.worker.snapshot.running)
            time.sleep(0.01)
        assert max(peak) == 2 and running.state.worker.snapshot.waiting >= 2, peak  # the rest at the gate
        _first_token_s(running.url)  # another tenant: not held back by batch's share
        other_end = time.monotonic()
        for t in threads:
            t.join(300)
        assert [a.status_code for a in answers] == [200] * 3
        assert other_end < max(ends.values())
        texts = {c["text"] for a in answers for c in a.json()["choices"]}
        assert len(texts) == 1  # greedy: held back or not, the same tokens
    finally:
        stop()
