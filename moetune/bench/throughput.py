"""Prefill and decode throughput of moetune and, optionally, transformers on the same checkpoint.

prefill tokens/s = prompt tokens / time of one engine step over the prompt (batch 1)
decode tokens/s  = batch × steps / time of `steps` engine decode steps after a prefill of `context`
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moetune.bench.timing import Timing, measure
from moetune.config import EngineConfig
from moetune.engine.engine import Engine
from moetune.engine.sampling import SamplingParams
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
    """Through the Engine, as a user's requests run: prefill = add one request of prefill_len tokens
    and step once (forward + LM head on the last row + sample); decode = `decode_steps` steps of a
    batch whose prompts (decode_context tokens each) were prefilled before the clock started."""
    dev, vocab = model.device, model.spec.vocab_size
    engine = _engine(model, s)
    prompt = random_prompts(vocab, 1, s.prefill_len, s.seed)[0].tolist()
    one = SamplingParams(max_tokens=1, ignore_eos=True)

    def prefill() -> None:
        engine.add_request(prompt, one)
        engine.step()

    rows = [BenchRow("moetune", f"prefill b=1 len={s.prefill_len}", s.prefill_len, measure(prefill, dev, s.runs))]
    params = SamplingParams(max_tokens=s.decode_steps + 1, ignore_eos=True)
    for b in s.decode_batches:
        prompts = random_prompts(vocab, b, s.decode_context, s.seed + b).tolist()

        def setup(prompts=prompts) -> None:
            for p in prompts:
                engine.add_request(p, params)
            engine.step()  # the prefill, untimed; every sequence samples its first token

        def decode(_) -> None:
            for _ in range(s.decode_steps):
                engine.step()

        rows.append(BenchRow("moetune", f"decode b={b}", b * s.decode_steps, measure(decode, dev, s.runs, setup=setup)))
    return rows


def _engine(model: MoETransformer, s: BenchSettings) -> Engine:
    """An engine whose step holds a whole workload: no chunking, no prefix sharing between runs."""
    B, bs = max(s.decode_batches), EngineConfig().block_size
    tokens = max(s.prefill_len, B * s.decode_context)
    blocks = B * -(-(max(s.prefill_len, s.decode_context + s.decode_steps) + 1) // bs)
    config = EngineConfig(max_num_seqs=B, max_num_batched_tokens=tokens, num_kv_blocks=blocks,
                          prefix_caching=False, chunked_prefill=False)
    return Engine(model, None, frozenset(), config)
