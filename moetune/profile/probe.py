"""Profiler: the model's Probe (phase clocks, routing) and the engine's StepObserver in one.

Attach with `profiler.attach(engine)`; detach restores the model exactly. While `recording`
is False (warm-up) steps run through the probes but nothing is kept.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from moetune.model.batch import StepBatch
from moetune.profile.metrics import padded_rows
from moetune.profile.records import Records
from moetune.profile.timer import ClockedLayer, PhaseTimer
from moetune.profile.trace import KINDS, RoutingTrace, id_dtype


class Profiler:
    def __init__(self, model, annotate: bool = False, on_step: Callable[[str], None] | None = None):
        self.model = model
        self.moe_layers = list(model.spec.moe_layers)  # [Lm]
        self.num_experts = model.spec.moe.num_experts
        self.timer = PhaseTimer(model.device, annotate)
        self.annotate = annotate
        self.on_step = on_step
        self.recording = True
        self.records = Records()
        self._step_ids: dict[int, np.ndarray] = {}
        self._step_moe: dict[int, tuple[np.ndarray, int]] = {}
        self._moved = [0, 0]  # dispatch, combine bytes of the current step
        self._start = 0.0
        self._range = None
        self._saved_layers = None

    # attach / detach -------------------------------------------------------------------------
    def attach(self, engine) -> None:
        self._saved_layers = self.model.layers
        self.model.layers = [ClockedLayer(layer, self.timer) for layer in self._saved_layers]
        self.model.attach_probe(self)
        engine.observer = self

    def detach(self, engine) -> None:
        engine.observer = None
        self.model.attach_probe(None)
        if self._saved_layers is not None:
            self.model.layers = self._saved_layers

    # Probe -----------------------------------------------------------------------------------
    def phase(self, layer: int, name: str):
        return self.timer.phase(layer, name)

    def routed(self, layer: int, route, permute, block_m: int) -> None:
        if not self.recording:
            return
        start = time.perf_counter()
        ids = route.topk_ids.to("cpu").numpy().astype(id_dtype(self.num_experts))  # [T, K]
        slot_counts = permute.counts.to("cpu").numpy()  # [P] rows per physical slot (what the kernel pads)
        counts = np.bincount(ids.ravel().astype(np.int64), minlength=self.num_experts)  # [E] per logical expert
        self._step_ids[layer] = ids
        self._step_moe[layer] = (counts, padded_rows(slot_counts, block_m))
        self.timer.bookkeeping[layer] += time.perf_counter() - start

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        self._moved[0] += dispatch_bytes
        self._moved[1] += combine_bytes

    # StepObserver ----------------------------------------------------------------------------
    def step_begin(self, kind: str, batch: StepBatch) -> None:
        self.timer.reset()
        self._step_ids, self._step_moe = {}, {}
        self._moved = [0, 0]
        if self.annotate:
            self._range = torch.profiler.record_function(kind)
            self._range.__enter__()
        self.timer.sync()
        self._start = time.perf_counter()

    def step_end(self, kind: str, batch: StepBatch) -> None:
        self.timer.sync()
        seconds = time.perf_counter() - self._start
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self.recording:
            self._keep(kind, batch, seconds)
        if self.on_step is not None:
            self.on_step(kind)

    def _keep(self, kind: str, batch: StepBatch, seconds: float) -> None:
        rec, step = self.records, len(self.records.steps)
        T = int(batch.input_ids.shape[0])
        seconds -= sum(self.timer.bookkeeping.values())  # the profiler's own copies are not the model's time
        rec.steps.append({"step": step, "kind": kind, "batch": batch.num_seqs, "tokens": T,
                          "context_tokens": int(sum(batch.context_lens)),
                          "attn_pairs": attention_pairs(batch.query_lens, batch.context_lens),
                          "dispatch_bytes": self._moved[0], "combine_bytes": self._moved[1],
                          "seconds": seconds})
        phase_sum = 0.0
        for (layer, name), secs in sorted(self.timer.phases.items()):
            rec.phases.append({"step": step, "kind": kind, "layer": layer, "phase": name, "seconds": secs})
            phase_sum += secs
        rec.phases.append({"step": step, "kind": kind, "layer": -1, "phase": "other",
                           "seconds": max(seconds - phase_sum, 0.0)})
        for layer, secs in sorted(self.timer.layer_seconds().items()):
            rec.layers.append({"step": step, "kind": kind, "layer": layer, "seconds": secs})
        self._keep_routing(step, kind, T)

    def _keep_routing(self, step: int, kind: str, T: int) -> None:
        rec = self.records
        counts = np.stack([self._step_moe[i][0] for i in self.moe_layers])  # [Lm, E]
        for j, layer in enumerate(self.moe_layers):
            rows = int(counts[j].sum())
            rec.moe.append({"step": step, "kind": kind, "layer": layer, "tokens": T, "rows": rows,
                            "padded_rows": self._step_moe[layer][1]})
        rec.counts.append(counts)
        rec.ids.append(np.stack([self._step_ids[i] for i in self.moe_layers], axis=1))  # [T, Lm, K]
        rec.kinds.append(kind)

    def trace(self) -> RoutingTrace:
        rec = self.records
        lens = [ids.shape[0] for ids in rec.ids]
        K = self.model.spec.moe.router.top_k
        ids = (np.concatenate(rec.ids) if rec.ids
               else np.zeros((0, len(self.moe_layers), K), id_dtype(self.num_experts)))  # [N, Lm, K]
        return RoutingTrace(
            topk_ids=ids,
            step_offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            step_kind=np.array([KINDS.index(k) for k in rec.kinds], dtype=np.uint8),
            step_index=np.arange(len(rec.ids), dtype=np.int64),
            layers=np.array(self.moe_layers, dtype=np.int16),
            num_experts=self.num_experts,
        )


def attention_pairs(query_lens: list[int], context_lens: list[int]) -> int:
    """Causal query·key pairs of a step: Σ q·ctx − q(q−1)/2 over sequences."""
    return int(sum(q * c - q * (q - 1) // 2 for q, c in zip(query_lens, context_lens)))
