"""Honest timing: synchronise before reading the clock, warm up, report the median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    runs: int


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[..., object], device: torch.device, runs: int = 3, warmup: int = 1,
            setup: Callable[[], object] | None = None) -> Timing:
    """Median wall time of `fn()`; with `setup`, `fn(setup())` and only `fn` is timed."""
    times = []
    for i in range(warmup + runs):
        args = () if setup is None else (setup(),)
        synchronize(device)
        start = time.perf_counter()
        fn(*args)
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return Timing(statistics.median(times), min(times), max(times), runs)
