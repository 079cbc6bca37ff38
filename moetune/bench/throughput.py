"""Prefill and decode throughput of moetune and, optionally, transformers on the same checkpoint.

prefill tokens/s = prompt tokens / time of one forward over the prompt (batch 1)
decode tokens/s  = batch × steps / time of `steps` decode forwards after a prefill of `context`
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moetune.bench.timing import Timing, measure
from moetune.model.batch import StepBatch
from moetune.model.transformer import MoETransformer


@dataclass(frozen=True)
class BenchSettings:
    prefill_len: int = 512
    decode_batches: tuple[int, ...] = (1, 16)
    decode_context: int = 128
    decode_steps: int = 32
    runs: int = 3
    seed: int = 0


@dataclass(frozen=True)
class BenchRow:
    engine: str
    workload: str  # "prefill b=1 len=512", "decode b=16"
    tokens: int
    timing: Timing

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.timing.median_s


def random_prompts(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen)  # [B, S]


def bench_moetune(model: MoETransformer, s: BenchSettings) -> list[BenchRow]:
    dev, vocab = model.device, model.spec.vocab_size
    prompt = random_prompts(vocab, 1, s.prefill_len, s.seed).to(dev)
    cache = model.new_cache(1, s.prefill_len)
    batch = _prefill(prompt)
    rows = [BenchRow("moetune", f"prefill b=1 len={s.prefill_len}", s.prefill_len,
                     measure(lambda: model.logits(model.forward(batch, cache)[-1:]), dev, s.runs))]
    for b in s.decode_batches:
        prompts = random_prompts(vocab, b, s.decode_context, s.seed + b).to(dev)

        def setup(prompts=prompts):
            cache = model.new_cache(prompts.shape[0], s.decode_context + s.decode_steps)
            hidden = model.forward(_prefill(prompts), cache)  # [B*S, D]
            return cache, hidden.view(prompts.shape[0], s.decode_context, -1)[:, -1]

        run = lambda state: _decode_steps(model, *state, s.decode_context, s.decode_steps)  # noqa: E731
        rows.append(BenchRow("moetune", f"decode b={b}", b * s.decode_steps, measure(run, dev, s.runs, setup=setup)))
    return rows


def _prefill(prompts: torch.Tensor) -> StepBatch:
    B, S = prompts.shape
    positions = torch.arange(S, device=prompts.device).repeat(B)
    return StepBatch(prompts.reshape(-1), positions, [S] * B, [S] * B, list(range(B)))


def _decode_steps(model: MoETransformer, cache, last: torch.Tensor, context: int, steps: int) -> None:
    """Greedy decode `steps` tokens for every sequence; last: [B, D] hidden of each last token."""
    B = last.shape[0]
    for step in range(steps):
        token = model.logits(last).argmax(-1)  # [B]
        ctx = context + step + 1
        positions = torch.full((B,), ctx - 1, device=token.device)
        last = model.forward(StepBatch(token, positions, [1] * B, [ctx] * B, list(range(B))), cache)  # [B, D]
