"""`moetune serve --ep-size R` as the user runs it: a process (and its spawned ranks) on a free port."""

import os
import re
import signal
import subprocess
import sys
import threading
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

