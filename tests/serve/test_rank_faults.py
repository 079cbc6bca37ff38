"""Serving over ranks when a rank dies, and at R = 4 with replicas.

SIGKILL of rank 1 under load: new requests get 503, the requests in flight end with an error
event, one line names the rank, the command exits non-zero within 10 s and no rank is left.
"""

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.serve.conftest import AUTH, PROMPTS, ServeProcess, alive, ask, metric


def test_sigkill_of_rank_1_mid_load_fails_the_server_cleanly():
    srv = ServeProcess("--ep-size", "2", "--max-num-seqs", "4")
    try:
        outcomes, started = [], threading.Semaphore(0)

        def ask(prompt):
            try:
                chunks = srv.client().completions.create(model="stdlib-moe", prompt=prompt, max_tokens=1000,
                                                         temperature=0, stream=True, extra_body={"ignore_eos": True})
                n = 0
                for _ in chunks:
                    n += 1
                    if n == 2:
                        started.release()
                outcomes.append(n)
            except Exception as exc:  # noqa: BLE001  (the error event, as the client raises it)
                outcomes.append(exc)

        threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS[:4]]
        for t in threads:
            t.start()
        for _ in threads:
            assert started.acquire(timeout=120)
        (rank1,) = srv.ranks
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        late = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 4}, headers=AUTH, timeout=30)
        assert late.status_code == 503 and late.json()["error"]["type"] == "server_error"
        code = srv.proc.wait(timeout=30)
        took = time.monotonic() - killed
        for t in threads:
            t.join(30)
        assert code != 0 and took < 10, (code, took)
        assert len(outcomes) == 4 and all(isinstance(o, Exception) for o in outcomes), outcomes
        assert all("rank failed" in str(o) for o in outcomes), outcomes
        srv._reader.join(10)
        named = [line for line in srv.lines if "rank 1" in line]
        assert len(named) == 1 and "SIGKILL" in named[0], srv.stderr
        assert "Traceback" not in srv.stderr
        assert not alive(rank1) and not [pid for pid in srv.ranks if alive(pid)]
    finally:
        srv.kill()


def test_16_concurrent_greedy_requests_at_r4_with_replicas_equal_one_rank_alone(alone):
    srv = ServeProcess("--ep-size", "4", "--redundant-experts", "4", "--placement", "round_robin",
                     "--max-num-seqs", "4", "--max-queue", "0")
    try:
        for stream in (False, True):
            with ThreadPoolExecutor(16) as pool:
                got = list(pool.map(lambda p: ask(srv, p, stream), PROMPTS))
            assert got == alone
        text = srv.metrics()
        assert all(metric(text, "moetune_rank_assigned_sequences_total", rank=r) >= 4 for r in range(4))
        assert srv.stop() == 0, srv.stderr
        assert not [pid for pid in srv.ranks if alive(pid)]
    finally:
        srv.kill()
