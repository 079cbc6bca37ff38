"""The runnable blocks of a markdown document, and a runner that executes them in order as a user would.

A fenced block whose language is bash, sh or python runs; every other fence (yaml, text, a tree) is
prose. An HTML comment on the line right above a block says how it runs:

- `<!-- docs-test: skip REASON -->`  not run; the test is skipped with REASON (a GPU, a cluster, the
  suite itself);
- `<!-- docs-test: after-install -->`  the block begins with the set-up steps (`python3 -m venv`,
  `. .venv/bin/activate`, `pip install`) joined by `&&`: the test runs in that install already, so
  those steps are dropped and the rest runs;
- `<!-- docs-test: server -->`  the block starts a server in the foreground: it runs in the
  background until the next `##` section (or the end), and the blocks after it wait for its /health.

Every block of one document runs in one directory, in order, with `set -euo pipefail`: a command that
fails anywhere in a block fails it. A block whose output carries an OpenAI error object (`{"error"`)
fails too (curl exits 0 on a 400). The port 8000 the documents use becomes a free one.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RUNS = {"bash": "bash", "sh": "bash", "python": "python"}
MARKER = re.compile(r"^<!--\s*docs-test:\s*(skip|after-install|server)\b\s*(.*?)\s*-->\s*$")
SETUP = re.compile(r"^(python3? -m venv\b|\. \S*activate$|source \S*activate$|pip3? install\b)")


class MarkerError(ValueError):
    """A `docs-test:` comment the extractor does not know, or one that is not right above a block."""


@dataclass(frozen=True)
class Block:
    doc: str          # the document's name, e.g. README.md
    line: int         # the line of the opening fence (1-based)
    lang: str         # bash | python
    text: str
    section: str      # the `##` heading above it
    mode: str = "run"  # run | skip | after-install | server
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def extract(text: str, doc: str) -> list[Block]:
    """The blocks of one markdown text that run (or are marked skipped), in document order."""
    lines = text.splitlines()
    blocks, section, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = re.match(r"^```(\w*)\s*$", line)
        if not fence:
            if "docs-test:" in line and not _above_block(lines, i):
                raise MarkerError(f"{doc}:{i + 1}: a docs-test comment must stand right above a fenced block")
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise MarkerError(f"{doc}:{i + 1}: the fence is never closed")
        mode, reason = _marker(lines[i - 1] if i else "", doc, i)
        lang = RUNS.get(fence.group(1))
        if lang is not None:
            body = "\n".join(lines[i + 1:end]) + "\n"
            blocks.append(Block(doc, i + 1, lang, body, section, mode, reason))
        elif mode != "run":
            raise MarkerError(f"{doc}:{i}: a docs-test comment above a ```{fence.group(1)} block, which never runs")
        i = end + 1
    return blocks


def _above_block(lines: list[str], i: int) -> bool:
    return i + 1 < len(lines) and lines[i + 1].startswith("```")


def _marker(line: str, doc: str, i: int) -> tuple[str, str]:
    if "docs-test:" not in line:
        return "run", ""
    m = MARKER.match(line.strip())
    if m is None:
        raise MarkerError(f"{doc}:{i}: unknown docs-test comment {line.strip()!r} (skip REASON | after-install | server)")
    mode, reason = m.group(1), m.group(2)
    if mode == "skip" and not reason:
        raise MarkerError(f"{doc}:{i}: `docs-test: skip` needs a reason")
    return mode, reason


def script(block: Block, port: int) -> str:
    """The text that runs: set-up steps dropped (after-install), port 8000 → `port`."""
    text = block.text
    if block.mode == "after-install":
        steps = [s.strip() for s in text.strip().split("&&")]
        kept = [s for s in steps if not SETUP.match(s)]
        if len(kept) == len(steps) or not kept:
            raise MarkerError(f"{block.id}: `after-install` but the block has no set-up steps before its commands")
        text = " && ".join(kept) + "\n"
    text = re.sub(r"(?<=[:\s])8000\b", str(port), text)
    if block.lang == "bash":
        return "set -euo pipefail\n" + text
    return text


@dataclass
class Outcome:
    returncode: int
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and '{"error"' not in self.output


@dataclass
class Runner:
    """Runs a document's blocks in order in `cwd`; a server block lives until its section ends."""

    cwd: Path
    timeout: float = 300
    port: int = field(default_factory=lambda: free_port())
    servers: list = field(default_factory=list)  # [(section, Popen)]
    env: dict = field(default_factory=dict)

    def run(self, block: Block) -> Outcome:
        self._stop_servers_before(block.section)
        if self.servers:
            self._wait_healthy()
        path = self.cwd / f".block-{block.line}.{'py' if block.lang == 'python' else 'sh'}"
        path.write_text(script(block, self.port))
        argv = [sys.executable if block.lang == "python" else "bash", str(path)]
        start = time.monotonic()
        if block.mode == "server":
            proc = subprocess.Popen(argv, cwd=self.cwd, env=self._env(), start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=(self.cwd / f".server-{block.line}.log").open("w"))
            self.servers.append((block.section, proc, block))
            self._wait_healthy()
            return Outcome(0, "", time.monotonic() - start)
        proc = subprocess.Popen(argv, cwd=self.cwd, env=self._env(), start_new_session=True, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            return Outcome(124, (out or "") + f"\n(timed out after {self.timeout:.0f} s)", time.monotonic() - start)
        _kill_group(proc)  # whatever the block left in the background (a server started with `&`)
        return Outcome(proc.returncode, out, time.monotonic() - start)

    def _env(self) -> dict:
        bin_dir = str(Path(sys.executable).parent)  # the installed console script `moetune`
        return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1",
                "MOETUNE_PROGRESS": "off", **self.env}

    def _wait_healthy(self, timeout: float = 180) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        section, proc, block = self.servers[-1]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = (self.cwd / f".server-{block.line}.log").read_text()
                raise AssertionError(f"{block.id}: the server exited {proc.returncode}:\n{log[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{block.id}: the server did not answer /health within {timeout:.0f} s")

    def _stop_servers_before(self, section: str) -> None:
        while self.servers and self.servers[-1][0] != section:
            self.stop_one()

    def stop_one(self) -> None:
        _, proc, _ = self.servers.pop()
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait(10)

    def close(self) -> None:
        while self.servers:
            self.stop_one()


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
