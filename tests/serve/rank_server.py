"""`moetune serve --ep-size R` as the user runs it: a process (and its spawned ranks) on a free port."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.serve.conftest import API_KEY, wait_for  # noqa: F401  (wait_for: for the rank tests)

AUTH = {"Authorization": f"Bearer {API_KEY}"}


class RankServer:
    def __init__(self, *args: str, env: dict | None = None, cwd=None, start_timeout: float = 180):
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "moetune", "serve", "--port", "0", "--device", "cpu",
                                      "--api-key", API_KEY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=cwd)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(start_timeout) or self.proc.poll() is not None:
            self.kill()
            raise AssertionError("the server did not start:\n" + self.stderr)
        self.url = re.search(r"http://[0-9.]+:\d+", next(line for line in self.lines if "http://" in line)).group(0)
        self.ranks = children(self.proc.pid)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if "Application startup complete" in line:
                self._ready.set()
        self._ready.set()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, timeout=kw.pop("timeout", 180),
                             **kw)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in getattr(self, "ranks", []):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._reader.join(10)


def children(parent: int) -> list[int]:
    """The spawned rank processes of `parent` (multiprocessing's spawn children)."""
    found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found if "spawn_main" in _cmdline(int(p))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="ignore")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def metric(text: str, name: str, **labels) -> float:
    """One sample of the Prometheus text: the line of `name` whose labels include `labels`."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        got = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and all(got.get(k) == str(v) for k, v in labels.items()):
            return float(value)
    raise KeyError(f"{name} {labels} not in /metrics")



def kill_rank_mid_load(srv: RankServer, prompts: list[str]) -> None:
    """SIGKILL the server's one spawned rank while 4 streams run: new requests get 503, the streams
    end with the error event, one line names rank 1, the command exits non-zero within 10 s and no
    rank is left."""
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

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts[:4]]
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


def recording(srv: RankServer):
    """POST /v1/expert_distribution/<route> on the server: a function of the route (and httpx's keywords)."""
    return lambda route, **kw: httpx.post(f"{srv.url}/v1/expert_distribution/{route}", headers=AUTH, timeout=120, **kw)
