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


FLUSH_STEPS = 64  # steps kept as clocks and tensors before they become rows


class Profiler:
    def __init__(self, model, annotate: bool = False, on_step: Callable[[str], None] | None = None):
        self.model = model
        self.moe_layers = list(model.spec.moe_layers)  # [Lm]
        self.num_experts = model.spec.moe.num_experts
        self.timer = PhaseTimer(model.device, annotate)
        self.annotate = annotate
        self.on_step = on_step
        self.recording = True
        self._records = Records()
        self._raw: dict[int, tuple] = {}  # layer → (topk_ids, slot counts, block_m) of the current step
        self._pending: list[tuple] = []  # (step fields, phase clocks, layer clocks, raw routing) not yet rows
        self._kept = 0  # steps recorded (rows or pending)
        self._moved = [0, 0]  # dispatch, combine bytes of the current step
        self._start = 0.0
        self._range = None
        self.trace_step = None  # torch_trace's step (profile --trace), called after each recorded step
        self._saved_layers = None

    @property
    def records(self) -> Records:
        """Everything recorded so far (steps still kept as clocks and tensors become rows first)."""
        self._flush()
        return self._records

    @records.setter
    def records(self, value: Records) -> None:
        self._pending.clear()
        self._records, self._kept = value, len(value.steps)

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
        """Keeps references only (every backend returns fresh tensors): the copies and counts are made
        later, outside the step's clock, FLUSH_STEPS steps at a time (`_flush`). Inside the step they
        would run on caches that the weight streams just flushed, at tens of µs per small op (docs/cpu.md)."""
        if self.recording:
            self._raw[layer] = (route.topk_ids, permute.counts, block_m)

    def _routing_of_steps(self, raws: list[list[tuple]], lens: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
        """The routing of many steps at once (`raws`: per step, per MoE layer, what `routed` kept;
        `lens`: each step's tokens): per step the ids [T, Lm, K] (views of one array) and the counts
        per logical expert [S, Lm, E]. A few array operations for all the pending steps rather than a
        dozen per step (each costs µs; the profiler's bookkeeping is part of its overhead)."""
        E, Lm, S = self.num_experts, len(self.moe_layers), len(raws)
        ids = torch.stack([torch.cat([raw[j][0] for raw in raws]) for j in range(Lm)], dim=1)  # [ΣT, Lm, K]
        ids = ids.to("cpu").numpy().astype(np.int64)
        step = np.repeat(np.arange(S), lens)  # [ΣT]: the step of each token
        flat = (step[:, None, None] * Lm + np.arange(Lm)[None, :, None]) * E + ids  # [ΣT, Lm, K]
        counts = np.bincount(flat.ravel(), minlength=S * Lm * E).reshape(S, Lm, E)  # [S, Lm, E]
        return np.split(ids.astype(id_dtype(E)), np.cumsum(lens)[:-1]), counts

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        self._moved[0] += dispatch_bytes
        self._moved[1] += combine_bytes

    # StepObserver ----------------------------------------------------------------------------
    def step_begin(self, kind: str, batch: StepBatch) -> None:
        self.timer.reset()
        self._raw = {}
        self._moved = [0, 0]
        self.start_clock(kind)

    def start_clock(self, kind: str) -> None:
        """A step begins: its ProfilerStep#N (a torch trace), its named range (annotate), its clock."""
        if self.trace_step is not None and self.recording:
            self.trace_step()
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
        """The step's clocks and routing, as they are: rows are made later, many steps at a time."""
        step = self._kept
        self._kept += 1
        seconds -= sum(self.timer.bookkeeping.values())  # the profiler's own copies are not the model's time
        row = (step, kind, batch.query_lens, batch.context_lens, self._moved, seconds)  # made a dict in `_flush`
        raw = [self._raw[i] for i in self.moe_layers]
        self._pending.append((row, dict(self.timer.phases), self.timer.layer_seconds(), raw))
        if len(self._pending) >= FLUSH_STEPS:
            self._flush()

    @staticmethod
    def _step_row(step: int, kind: str, query_lens: list[int], context_lens: list[int], moved: list[int],
                  seconds: float) -> dict:
        return {"step": step, "kind": kind, "batch": len(query_lens), "tokens": sum(query_lens),
                "context_tokens": int(sum(context_lens)), "attn_pairs": attention_pairs(query_lens, context_lens),
                "dispatch_bytes": moved[0], "combine_bytes": moved[1], "seconds": seconds}

    def _flush(self) -> None:
        """Rows of the pending steps, in step order. Made in batches, not at each step's end: a
        step's few dozen small dict and array operations, right after the step, cost ~4× what they
        cost back to back (docs/cpu.md)."""
        if not self._pending:
            return
        ids, counts = self._routing_of_steps([raw for *_, raw in self._pending],
                                             [sum(kept[2]) for kept, *_ in self._pending])
        for (kept, phases, layers, raw), step_ids, step_counts in zip(self._pending, ids, counts):
            row = self._step_row(*kept)
            self._keep_rows(row, phases, layers)
            self._keep_routing(row["step"], row["kind"], row["tokens"], raw, step_ids, step_counts)
        self._pending.clear()

    def _keep_rows(self, row: dict, phases: dict, layers: dict) -> None:
        rec, step, kind = self._records, row["step"], row["kind"]
        rec.steps.append(row)
        phase_sum = 0.0
        for (layer, name), secs in sorted(phases.items()):
            rec.phases.append({"step": step, "kind": kind, "layer": layer, "phase": name, "seconds": secs})
            phase_sum += secs
        rec.phases.append({"step": step, "kind": kind, "layer": -1, "phase": "other",
                           "seconds": max(row["seconds"] - phase_sum, 0.0)})
        for layer, secs in sorted(layers.items()):
            rec.layers.append({"step": step, "kind": kind, "layer": layer, "seconds": secs})

    def _keep_routing(self, step: int, kind: str, T: int, raw: list[tuple], ids: np.ndarray,
                      counts: np.ndarray) -> None:
        """One step's routing rows: ids [T, Lm, K], counts [Lm, E] (`_routing_of_steps`)."""
        rec = self._records
        for j, layer in enumerate(self.moe_layers):
            _, slot_counts, block_m = raw[j]
            rows = int(counts[j].sum())
            padded = rows if block_m == 1 else padded_rows(slot_counts.to("cpu").numpy(), block_m)
            rec.moe.append({"step": step, "kind": kind, "layer": layer, "tokens": T, "rows": rows,
                            "padded_rows": padded})  # (block_m 1: nothing padded)
        rec.counts.append(counts)
        rec.ids.append(ids)
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
