"""`moetune serve` as a process: SIGTERM with requests in flight exits 0 and nothing hangs."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_with_requests_in_flight_exits_cleanly():
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "moetune", "serve", "--port", str(port), "--max-num-seqs", "4",
                             "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        outcomes = []

        def ask(max_tokens):
            try:
                r = httpx.post(f"{url}/v1/completions", timeout=60,
                               json={"prompt": "import os\n", "max_tokens": max_tokens, "ignore_eos": True})
                outcomes.append(r.status_code)
            except httpx.HTTPError as exc:  # cut off at the drain deadline: a clean error, not a hang
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=ask, args=(n,)) for n in (8, 8, 40, 40)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
        assert len(outcomes) == 4 and outcomes.count(200) >= 2, outcomes  # the short ones finish in the drain
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
