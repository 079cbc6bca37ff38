"""The serve tests' servers, in one place: a real `moetune serve` app on a free localhost port run by
uvicorn in a background thread (`start_server`, the `server` fixture), and `moetune serve` as the user
runs it, a process and its spawned ranks (`ServeProcess`); what one rank answers alone (`alone`), and
the helpers they share (free ports, process checks, Prometheus samples)."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from moetune.config import parse_config

API_KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPTS = [f"def {name}(x):\n" for name in ("parse", "load", "read", "write", "close", "open", "split", "join",
                                             "walk", "copy", "move", "sort", "find", "match", "encode", "decode")]
MAX_TOKENS = 20


@dataclass
class Running:
    url: str
    state: object  # ServerState: tests peek at the engine through it

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", API_KEY), max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)

    @property
    def model(self) -> str:
        return self.state.model_name


def start_server(config: dict, api_key: str | None = API_KEY):
    """→ (Running, stop): the bundled model behind uvicorn on 127.0.0.1:<free port>."""
    from moetune.serve.server import bind, build_server, uvicorn_config
    from moetune.serve.shutdown import DrainingServer

    cfg = parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}, **config})
    sock = bind("127.0.0.1", 0)
    built = build_server(cfg, api_key)
    server = DrainingServer(uvicorn_config(built.app, "warning", cfg.serve), built.state, cfg.serve.drain_timeout_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(30)

    return Running(f"http://127.0.0.1:{sock.getsockname()[1]}", built.state), stop


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    running, stop = start_server({"engine": {"max_num_seqs": 16},
                                  "serve": {"max_queue": 64, "record_dir": str(tmp_path_factory.mktemp("runs")),
                                            "max_body_bytes": 64 * 1024,
                                            "tenants": {"tiny": {"tokens_per_s": 1, "burst_tokens": 40}}}})
    yield running
    stop()


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def alone(server):
    """What one rank answers to each of PROMPTS sent alone."""
    client = server.client()
    return [client.completions.create(model=server.model, prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text for p in PROMPTS]


def ask(srv, prompt: str, stream: bool) -> str:
    """One greedy completion of MAX_TOKENS from `srv` (anything with .client()), streamed or not."""
    client = srv.client()
    if not stream:
        return client.completions.create(model="stdlib-moe", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
    chunks = client.completions.create(model="stdlib-moe", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    return "".join(c.choices[0].text for c in chunks if c.choices)


class ServeProcess:
    """`moetune serve` as the user runs it: a process (and its spawned ranks) on a free port, once
    uvicorn says it started. api_key None: no key; launcher: what python runs (default `-m moetune`)."""

    def __init__(self, *args: str, env: dict | None = None, cwd=None, start_timeout: float = 180,
                 api_key: str | None = API_KEY, launcher: tuple[str, ...] = ("-m", "moetune")):
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        key = ["--api-key", api_key] if api_key else []
        self.api_key = api_key
        self.proc = subprocess.Popen([sys.executable, *launcher, "serve", "--port", "0", "--device", "cpu", *key,
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=cwd)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(start_timeout) or self.proc.poll() is not None:
            self.kill()
            raise AssertionError("the server did not start:\n" + self.stderr)
        self.url = re.search(r"http://[0-9.]+:\d+", next(line for line in self.lines if "http://" in line)).group(0)
        # accepting connections: uvicorn's startup line comes a little before
        if not wait_for(self._healthy, start_timeout) or self.proc.poll() is not None:
            self.kill()
            raise AssertionError("the server started but /health never answered 200:\n" + self.stderr)
        self.ranks = children(self.proc.pid)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return self.proc.poll() is not None  # exited: stop waiting (the caller sees it)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if "Application startup complete" in line:
                self._ready.set()
        self._ready.set()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def output(self, timeout: float = 30) -> str:
        """All of stderr, once the process has exited."""
        self._reader.join(timeout)
        return self.stderr

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0,
                             timeout=kw.pop("timeout", 180), **kw)

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


def kill_rank_mid_load(srv: "ServeProcess", prompts: list[str]) -> None:
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


def recording(srv: "ServeProcess"):
    """POST /v1/expert_distribution/<route> on the server: a function of the route (and httpx's keywords)."""
    return lambda route, **kw: httpx.post(f"{srv.url}/v1/expert_distribution/{route}", headers=AUTH, timeout=120, **kw)
