"""Step times for adaptive k: a clock that times whole decode steps (the engine's wall clock, or a
cost model a test injects) and a fitted line t(R) = t0 + t1·R over a step kind's timed steps.

The fit is exponentially weighted least squares: `fade` multiplies the earlier samples' weights by
`decay` (the owner fades every kind's fit on each timed step, so a kind timed rarely forgets as
fast, in steps, as one timed on every step), `add` adds a sample of weight 1. While the timed
steps' rows barely vary (weighted variance < MIN_SPREAD rows²) the slope is not measured: `line`
takes a slope handed in (another kind's measured one), else the prior t1 = t0 / PRIOR_KNEE through
the samples' mean.
"""

from __future__ import annotations

import time
from typing import Protocol

PRIOR_KNEE = 8.0  # rows at which a step costs twice a one-row step, until the timings say otherwise
MIN_SPREAD = 0.25  # weighted variance of the timed steps' rows (rows²) below which the slope is not measured


class StepClock(Protocol):
    """Times one decode step: `start` before it, `seconds` after (told the step's rows and whether it
    verified drafts, which a cost model uses and a wall clock ignores)."""

    def start(self) -> None: ...

    def seconds(self, rows: int, verified: bool) -> float: ...


class WallClock:
    def __init__(self):
        self._t = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def seconds(self, rows: int, verified: bool) -> float:
        return time.perf_counter() - self._t


class StepFit:
    """t(R) = t0 + t1·R fitted to one kind of step (plain decodes, or verify steps)."""

    def __init__(self, decay: float):
        self.decay = decay
        self._s = [0.0] * 5  # Σw, Σw·R, Σw·t, Σw·R², Σw·R·t (decayed)

    @property
    def empty(self) -> bool:
        return self._s[0] <= 0 or self._s[2] <= 0

    def fade(self) -> None:
        self._s = [v * self.decay for v in self._s]

    def add(self, rows: int, seconds: float) -> None:
        for i, v in enumerate((1.0, rows, seconds, rows * rows, rows * seconds)):
            self._s[i] += v

    def at(self, rows: int) -> float:
        """The fitted seconds of a step of `rows` rows (not `empty`)."""
        t0, t1 = self.line()
        return t0 + t1 * rows

    def slope(self) -> float | None:
        """t1 measured from the samples' spread of rows, or None (too little spread, no samples)."""
        w, sr, st, srr, srt = self._s
        if self.empty:
            return None
        mr, mt = sr / w, st / w
        var = srr / w - mr * mr
        if var < MIN_SPREAD:
            return None
        t1 = (srt / w - mr * mt) / var
        return min(max(t1, mt * 1e-3), mt)  # timing noise: a row costs something, and less than a step

    def line(self, slope: float | None = None) -> tuple[float, float]:
        """(t0, t1) in seconds: the measured slope, else `slope`, else the prior knee's, through the
        samples' mean. Call only when not `empty`."""
        w, sr, st = self._s[:3]
        mr, mt = sr / w, st / w
        t1 = self.slope()
        if t1 is None and slope is not None:
            t1 = min(slope, mt / max(mr, 1.0))  # another kind's per-row cost, at most this kind's whole step
        if t1 is None:  # the prior's slope through the mean: t0 (1 + mr / knee) = mt
            t0 = mt / (1 + mr / PRIOR_KNEE)
            return t0, t0 / PRIOR_KNEE
        return max(mt - t1 * mr, mt * 1e-2), t1
