"""ExpertLoadWindow: live per-layer expert load over the last W engine steps, for /metrics.

A `Probe` (moetune.probe) that only listens to `routed`: each MoE layer's top-k ids are counted
per expert into row `step % W` of a ring buffer [W, Lm, E], read only when /metrics is scraped. On
a GPU the count is a scatter-add on the device (no host sync); on the CPU it is numpy's bincount
on the ring's memory: the three torch ops per layer cost ~70 µs of a 0.8 ms batch-1 decode step
(the bundled model's 4 layers, in-process on the 2-vCPU EPYC; docs/benchmarks.md). While a
recording runs, the Profiler owns the model's probe slot and `Tee` forwards routing to both.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from moetune.profile.metrics import LoadStats, per_layer_stats

_NULL = nullcontext()


class ExpertLoadWindow:
    times_phases = False  # routing only: decode steps may run fused (model/fused_decode.py)

    def __init__(self, model, window_steps: int):
        self.layers = list(model.spec.moe_layers)  # [Lm] model layer index of each row
        self.num_experts = model.spec.moe.num_experts
        self._row = {layer: j for j, layer in enumerate(self.layers)}
        self._buf = torch.zeros(window_steps, len(self.layers), self.num_experts, dtype=torch.long,
                                device=model.device)  # [W, Lm, E]
        self._host = self._buf.numpy() if self._buf.device.type == "cpu" else None  # the same memory
        self._pos = 0
        self._filled = 0  # rows of the ring that hold a step
        self.last_ids: list = [None] * len(self.layers)  # per MoE layer [T, K] of the latest step (device)

    # the engine thread -----------------------------------------------------------------------
    def begin_step(self) -> None:
        self._pos = (self._pos + 1) % self._buf.shape[0]
        self._filled = min(self._filled + 1, self._buf.shape[0])
        if self._host is not None:
            self._host[self._pos] = 0
        else:
            self._buf[self._pos].zero_()
        self.last_ids = [None] * len(self.layers)

    def phase(self, layer: int, name: str):
        return _NULL

    def routed(self, layer: int, route, permute, block_m: int) -> None:
        row = self._row[layer]
        self.last_ids[row] = route.topk_ids  # [T, K]
        if self._host is not None:
            counts = self._host[self._pos, row]  # [E], a view
            counts += np.bincount(route.topk_ids.numpy().reshape(-1), minlength=self.num_experts)
            return
        ids = route.topk_ids.reshape(-1)  # [T*K]
        self._buf[self._pos, row].index_add_(0, ids, torch.ones_like(ids))

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        pass

    # any thread ------------------------------------------------------------------------------
    def counts(self) -> np.ndarray:
        """[Lm, E] token copies per layer and expert over the window."""
        return self._buf.sum(0).cpu().numpy()

    def distinct_per_step(self) -> np.ndarray:
        """[S] Σ over MoE layers of the distinct experts each of the window's steps woke (S ≤ W; the
        step in progress, if any, counts what it has routed so far)."""
        woken = (self._buf > 0).sum(dim=(1, 2)).cpu().numpy()  # [W]
        rows = [(self._pos - j) % self._buf.shape[0] for j in range(self._filled)]  # the newest first
        return woken[rows]

    def stats(self) -> list[tuple[int, np.ndarray, LoadStats]]:
        counts = self.counts()
        return list(zip(self.layers, counts, per_layer_stats(counts)))


class Tee:
    """The Profiler's probe (phase clocks, routing record) plus the live window's routing count."""

    def __init__(self, profiler, window: ExpertLoadWindow):
        self.profiler, self.window = profiler, window

    def phase(self, layer: int, name: str):
        return self.profiler.phase(layer, name)

    def routed(self, layer: int, route, permute, block_m: int) -> None:
        self.profiler.routed(layer, route, permute, block_m)
        self.window.routed(layer, route, permute, block_m)

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        self.profiler.moved(layer, dispatch_bytes, combine_bytes)
