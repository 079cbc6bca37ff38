"""A benchmark's table written into its own section of docs/benchmarks.md, with what makes a figure
checkable: the command line, the commit (marked dirty when the tree has changes), the machine and the
load before and after. The section lies between `<!-- bench: KEY -->` and `<!-- /bench: KEY -->`; a
re-run replaces it (appended at the end when the markers are absent)."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=DOC.parent, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (dirty: uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores visible, Python {platform.python_version()}"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "not available"


def section(key: str, title: str, table: list[str], load_before: str, load_after: str,
            argv: list[str] | None = None) -> str:
    argv = argv if argv is not None else [Path(sys.argv[0]).as_posix(), *sys.argv[1:]]
    return "\n".join([f"<!-- bench: {key} -->", f"### {title}", "",
                      f"- command: `python {shlex.join(argv)}`", f"- commit: {commit()}",
                      f"- machine: {machine()}", f"- load: {load_before} before → {load_after} after",
                      f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "", *table,
                      f"<!-- /bench: {key} -->"])


def write_section(key: str, text: str, doc: Path = DOC) -> None:
    """Replace the section `key` of `doc` by `text` (a `section(...)`), or append it."""
    old = doc.read_text() if doc.exists() else "# Benchmarks: measured tables\n"
    start, end = f"<!-- bench: {key} -->", f"<!-- /bench: {key} -->"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        new = head + text + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    tmp = doc.with_suffix(".tmp")
    tmp.write_text(new)
    tmp.replace(doc)
