"""Records: the raw rows a Profiler collects during a run, one list per table."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Records:
    """Raw rows, one list per table; `tables.py` turns them into DataFrames."""

    steps: list[dict] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)
    layers: list[dict] = field(default_factory=list)
    moe: list[dict] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)  # per step [Lm, E]
    ids: list[np.ndarray] = field(default_factory=list)  # per step [T, Lm, K]
    kinds: list[str] = field(default_factory=list)
