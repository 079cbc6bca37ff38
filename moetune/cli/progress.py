"""Progress of a long command on stderr, in phases (loading, steps, writing, ...).

On a terminal: a rich bar with done/total, rate, elapsed time and ETA (transient). Piped, or under CI
(`CI` set), or with `MOETUNE_PROGRESS=plain`: one plain line every few seconds
(`MOETUNE_PROGRESS_S`, default 5), e.g.

    profile: steps 12/40 (30%), 2.10/s, elapsed 5.7 s, ETA 13 s

`MOETUNE_PROGRESS=off` prints nothing. Plain lines start only once the work has advanced once, so a
mistake found while loading stays the one line on stderr (cli/funnel.py); a phase without a total
(writing the run directory) still gets a line every few seconds with its elapsed time.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager


def _seconds(s: float) -> str:
    if s < 90:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


class PlainProgress:
    """One line to `stream` every `every` seconds (from a daemon thread), once work has begun."""

    def __init__(self, command: str, every: float, stream=None):
        self.command, self.every, self.stream = command, every, stream or sys.stderr
        self.name, self.total, self.done, self.note = "starting", None, 0, ""
        self.start = time.monotonic()
        self.begun = False
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="moetune-progress", daemon=True)
        self._thread.start()

    def phase(self, name: str, total: int | None = None) -> None:
        """Start a phase; the phase that ends gets its closing line (once work has begun)."""
        with self._lock:
            closing = self.line() if self.begun and self.done else None
            self.name, self.total, self.done, self.note = name, total, 0, ""
            self.start = time.monotonic()
        if closing is not None:
            self._emit(closing)

    def update(self, done: int | None = None, advance: int = 0, note: str | None = None) -> None:
        with self._lock:
            self.done = self.done + advance if done is None else done
            self.note = self.note if note is None else note
            self.begun = self.begun or self.done > 0

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        parts = [f"{self.command}: {self.name}"]
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            parts[0] += f" {self.done}/{self.total} ({100 * self.done / self.total:.0f}%)"
        elif self.done:
            parts[0] += f" {self.done}"
        if self.done:
            parts.append(f"{rate:.2f}/s")
        parts.append(f"elapsed {_seconds(elapsed)}")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {_seconds(max(self.total - self.done, 0) / rate)}")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                text = self.line() if self.begun else None
            if text is not None:
                self._emit(text)

    def _emit(self, text: str) -> None:
        """One whole line per write: the beat thread and a phase's closing line never interleave."""
        with self._write_lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def finish(self) -> None:
        """The work ended well: the last phase's closing line."""
        self.phase("done")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class RichProgress:
    """A transient rich bar on the terminal (done/total, elapsed, ETA); each phase resets it."""

    def __init__(self, command: str, console):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn())
        self.command, self.name = command, "starting"
        self.bar = Progress(*columns, console=console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task(f"{command}: starting", total=None)

    def phase(self, name: str, total: int | None = None) -> None:
        self.name = name  # a new task: rich's reset keeps the old total when given None
        self.bar.remove_task(self.task)
        self.task = self.bar.add_task(f"{self.command}: {name}", total=total)

    def update(self, done: int | None = None, advance: int = 0, note: str | None = None) -> None:
        kw = {"completed": done} if done is not None else {"advance": advance}
        if note is not None:
            kw["description"] = f"{self.command}: {self.name}, {note}"
        self.bar.update(self.task, **kw)

    def finish(self) -> None:
        return None

    def close(self) -> None:
        self.bar.stop()


class _Silent:
    def phase(self, name: str, total: int | None = None) -> None:
        return None

    def update(self, done: int | None = None, advance: int = 0, note: str | None = None) -> None:
        return None

    def finish(self) -> None:
        return None

    def close(self) -> None:
        return None


@contextmanager
def progress(command: str):
    """`with progress("profile") as p: p.phase("steps", total=40); p.update(advance=1)`."""
    from rich.console import Console

    mode = os.environ.get("MOETUNE_PROGRESS", "auto")
    err = Console(stderr=True)
    if mode == "off":
        reporter = _Silent()
    elif mode == "plain" or os.environ.get("CI") or not err.is_terminal:
        reporter = PlainProgress(command, float(os.environ.get("MOETUNE_PROGRESS_S", "5") or 5))
    else:
        reporter = RichProgress(command, err)
    try:
        yield reporter
        reporter.finish()
    finally:
        reporter.close()
