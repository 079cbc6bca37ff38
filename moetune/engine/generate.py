"""Batched generation: one prefill step over all prompts, then batched decode steps.

Each step is schedule → run model → sample/postprocess. Sequences finish independently; the
decode batch shrinks as they do. (Continuous batching with a paged cache replaces the schedule.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from moetune.engine.sampling import SamplingParams, sample
from moetune.engine.sequence import Sequence
from moetune.errors import RequestError
from moetune.model.batch import StepBatch
from moetune.model.kv_cache import KVCache
from moetune.model.transformer import MoETransformer


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str


class StepObserver(Protocol):
    """Told about each step (kind is "prefill" or "decode"); the profiler implements it."""

    def step_begin(self, kind: str, batch: StepBatch) -> None: ...

    def step_end(self, kind: str, batch: StepBatch) -> None: ...


class Generator:
    def __init__(self, model: MoETransformer, tokenizer, eos_ids: frozenset[int]):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.observer: StepObserver | None = None

    def encode(self, prompt: str | list[int]) -> list[int]:
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)  # BOS as the tokenizer says
        if not ids:
            bos = self.model.spec.bos_token_id
            ids = [bos if bos is not None else next(iter(self.eos_ids), 0)]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]) -> list[Completion]:
        seqs = self._admit(prompts, params)
        for _ in self._run(seqs):
            pass
        return [Completion(s.prompt_ids, s.output_ids, s.text, s.finish_reason or "length") for s in seqs]

    def stream(self, prompt: str | list[int], params: SamplingParams) -> Iterator[str]:
        """Yield the completion text of one prompt piece by piece."""
        for _, delta in self._run(self._admit([prompt], params)):
            if delta:
                yield delta

    def _admit(self, prompts, params) -> list[Sequence]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        limit = self.model.spec.max_position
        seqs = []
        for i, (prompt, p) in enumerate(zip(prompts, plist)):
            ids = self.encode(prompt)
            if len(ids) >= limit:
                raise RequestError(
                    f"prompt {i} has {len(ids)} tokens but the model's context is {limit}; shorten the prompt"
                )
            max_len = min(limit, len(ids) + p.max_tokens)
            seqs.append(Sequence(i, ids, p, self.eos_ids, max_len, slot=i))
        return seqs

    def _run(self, seqs: list[Sequence]) -> Iterator[tuple[Sequence, str]]:
        cache = self.model.new_cache(len(seqs), max(s.max_len for s in seqs))
        batch, kind = _prefill_batch(seqs, self.model.device), "prefill"
        while True:
            for seq, delta in self._step(batch, kind, seqs_in(batch, seqs), cache):
                yield seq, delta
            live = [s for s in seqs if not s.finished]
            if not live:
                return
            batch, kind = _decode_batch(live, self.model.device), "decode"

    def _step(self, batch: StepBatch, kind: str, seqs: list[Sequence], cache: KVCache
              ) -> list[tuple[Sequence, str]]:
        if self.observer is not None:
            self.observer.step_begin(kind, batch)
        hidden = self.model.forward(batch, cache)  # [T, D]
        logits = self.model.logits(hidden[batch.last_token_index()])  # [B, V]
        if self.observer is not None:
            self.observer.step_end(kind, batch)
        out = []
        for row, seq in zip(logits, seqs):
            token = sample(row, seq.params, seq.generator)
            out.append((seq, seq.append(token, self.decode)))
        return out


def seqs_in(batch: StepBatch, seqs: list[Sequence]) -> list[Sequence]:
    by_slot = {s.slot: s for s in seqs}
    return [by_slot[slot] for slot in batch.slots]


def _prefill_batch(seqs: list[Sequence], device: torch.device) -> StepBatch:
    ids = [t for s in seqs for t in s.prompt_ids]
    positions = [p for s in seqs for p in range(len(s.prompt_ids))]
    lens = [len(s.prompt_ids) for s in seqs]
    return StepBatch(_long(ids, device), _long(positions, device), lens, lens, [s.slot for s in seqs])


def _decode_batch(seqs: list[Sequence], device: torch.device) -> StepBatch:
    ids = [s.output_ids[-1] for s in seqs]
    positions = [s.num_tokens - 1 for s in seqs]
    return StepBatch(_long(ids, device), _long(positions, device), [1] * len(seqs),
                     [s.num_tokens for s in seqs], [s.slot for s in seqs])


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
