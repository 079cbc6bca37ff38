"""Phase and layer clocks: synchronise the device, read perf_counter, accumulate per step.

On CUDA the device is synchronised before each clock read (so a phase's time is the device work
it launched, not the launch latency); on CPU the ops are synchronous and perf_counter suffices.
With `annotate`, each phase is also a `torch.profiler.record_function` range named after it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable

import torch


def device_sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class PhaseTimer:
    """Seconds per (layer, phase) and per layer within the current step."""

    def __init__(self, device: torch.device, annotate: bool = False):
        self.sync = device_sync(device)
        self.annotate = annotate
        self.phases: dict[tuple[int, str], float] = defaultdict(float)
        self.layers: dict[int, float] = defaultdict(float)
        self.bookkeeping: dict[int, float] = defaultdict(float)  # the profiler's own time inside a layer

    def reset(self) -> None:
        self.phases.clear()
        self.layers.clear()
        self.bookkeeping.clear()

    def layer_seconds(self) -> dict[int, float]:
        """Measured wall time of each layer, less the profiler's own bookkeeping inside it."""
        return {i: secs - self.bookkeeping.get(i, 0.0) for i, secs in self.layers.items()}

    def phase(self, layer: int, name: str) -> "_Span":
        return _Span(self, layer, name)

    def layer(self, layer: int) -> "_Span":
        return _Span(self, layer, None)


class _Span:
    __slots__ = ("timer", "layer", "name", "start", "range")

    def __init__(self, timer: PhaseTimer, layer: int, name: str | None):
        self.timer, self.layer, self.name = timer, layer, name
        self.range = None

    def __enter__(self):
        if self.timer.annotate:
            begin = time.perf_counter()
            label = self.name if self.name is not None else f"layer{self.layer}"
            self.range = torch.profiler.record_function(label)
            self.range.__enter__()
            self.timer.bookkeeping[self.layer] += time.perf_counter() - begin
        self.timer.sync()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.timer.sync()
        elapsed = time.perf_counter() - self.start
        if self.name is None:
            self.timer.layers[self.layer] += elapsed
        else:
            self.timer.phases[(self.layer, self.name)] += elapsed
        if self.range is not None:
            begin = time.perf_counter()
            self.range.__exit__(*exc)
            self.timer.bookkeeping[self.layer] += time.perf_counter() - begin
        return False


class ClockedLayer:
    """A decoder layer wrapped so its whole call is timed; attributes pass through."""

    def __init__(self, inner, timer: PhaseTimer):
        self._inner = inner
        self._timer = timer

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, *args, **kwargs):
        with self._timer.layer(self._inner.index):
            return self._inner(*args, **kwargs)
