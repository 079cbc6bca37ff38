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


@dataclass(frozen=True)
class Work:
    """One timed thing: `fn()`, or `fn(setup())` with `setup` untimed."""
    fn: Callable[..., object]
    setup: Callable[[], object] | None = None


def measure_alternating(a: Work, b: Work, device: torch.device, runs: int = 3, warmup: int = 1
                        ) -> tuple[Timing, Timing]:
    """Timings of two workloads whose runs take turns (a b, b a, a b, ...). On a machine whose speed
    drifts over minutes (a shared VM: its read rate moved 26-59 GB/s within a session here), timing all
    of one and then all of the other compares two different machines; taking turns slows both
    alike, so the ratio of the medians is a same-time comparison."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(warmup + runs):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            work = (a, b)[side]
            args = () if work.setup is None else (work.setup(),)
            synchronize(device)
            start = time.perf_counter()
            work.fn(*args)
            synchronize(device)
            if i >= warmup:
                times[side].append(time.perf_counter() - start)
    return tuple(Timing(statistics.median(t), min(t), max(t), runs) for t in times)  # type: ignore[return-value]
