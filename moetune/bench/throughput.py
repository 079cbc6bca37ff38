"""Prefill and decode throughput of moetune and, optionally, transformers on the same checkpoint.

prefill tokens/s = prompt tokens / time of one engine step over the prompt (batch 1)
decode tokens/s  = batch × steps / time of `steps` engine decode steps after a prefill of `context`
and, for moetune, the work those steps did (weight bytes read by decode, FLOPs of prefill; see
`roofline`), so that the achieved rates can be set against the machine's own limits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from moetune.bench.roofline import LimitSampler, dense_weight_bytes, expert_bytes, prefill_flops
from moetune.bench.timing import Timing, Work, measure, measure_alternating
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
    speculative: str | None = None  # engine.speculative of the moetune runs ("ngram:K"; None: plain decode)


@dataclass(frozen=True)
class BenchRow:
    engine: str
    workload: str  # "prefill b=1 len=512", "decode b=16"
    tokens: int
    timing: Timing
    weight_bytes: float = 0.0  # decode: weight bytes one timed run read (0: not counted)
    flops: float = 0.0  # prefill: FLOPs of one timed run (0: not counted)
    limit: float = 0.0  # the machine's limit (GB/s, GFLOP/s) sampled beside these runs (0: not sampled)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.timing.median_s

    @property
    def bytes_per_token(self) -> float:
        """Weight bytes read per generated token (decode; 0 when not counted)."""
        return self.weight_bytes / self.tokens if self.tokens else 0.0

    @property
    def gbytes_per_s(self) -> float:
        return self.weight_bytes / self.timing.median_s / 1e9

    @property
    def gflops_per_s(self) -> float:
        return self.flops / self.timing.median_s / 1e9


def random_prompts(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen)  # [B, S]


@dataclass(frozen=True)
class Planned:
    """A workload of one engine, ready to time; `row` turns its timing into the table's row."""
    engine: str
    workload: str
    tokens: int
    work: Work
    flops: float = 0.0  # prefill: FLOPs of one run
    bytes_read: Callable[[], float] | None = None  # decode: weight bytes of one run, asked once its runs are done

    @property
    def limit_kind(self) -> str:
        """The machine limit its rate is set against: "read" (decode) or "matmul" (prefill)."""
        return "read" if self.bytes_read is not None else "matmul"

    def row(self, timing: Timing, limit: float = 0.0) -> BenchRow:
        read = self.bytes_read() if self.bytes_read is not None else 0.0
        return BenchRow(self.engine, self.workload, self.tokens, timing, weight_bytes=read, flops=self.flops,
                        limit=limit)


def sampled_beside(plans: list[Planned], sampler: LimitSampler) -> list[Planned]:
    """The plans, each taking one sample of its limit before every run (`LimitSampler.beside`)."""
    return [replace(p, work=sampler.beside(p.work, p.workload, p.limit_kind)) for p in plans]


def bench_moetune(model: MoETransformer, s: BenchSettings, sampler: LimitSampler | None = None,
                  on_workload=None) -> list[BenchRow]:
    """Every workload of `plan_moetune`, timed one after the other; with a `sampler`, each run
    preceded by a sample of the machine's limit, kept in the row. on_workload: progress,
    on_workload(done, total) before the first workload (done 0) and after each."""
    plans, done = plan_moetune(model, s)
    if sampler is not None:
        plans = sampled_beside(plans, sampler)
    rows = []
    for i, p in enumerate(plans):
        if on_workload is not None:
            on_workload(i, len(plans))
        rows.append(p.row(measure(p.work.fn, model.device, s.runs, warmup=WARMUP, setup=p.work.setup),
                          sampler.median(p.workload) if sampler is not None else 0.0))
    if on_workload is not None:
        on_workload(len(plans), len(plans))
    done()
    return rows


def plan_moetune(model: MoETransformer, s: BenchSettings) -> tuple[list[Planned], Callable[[], None]]:
    """Through the Engine, as a user's requests run: prefill = add one request of prefill_len tokens
    and step once (forward + LM head on the last row + sample); decode = `decode_steps` tokens per
    sequence of a batch whose prompts (decode_context tokens each) were prefilled before the clock
    started (`decode_steps` steps, fewer with `speculative`: the steps until they finish). Returns
    the workloads and a `done()` to call after timing them (it unhooks the expert counting). A decode
    row's weight bytes count the experts its runs routed to, so its row must be made right after its
    runs, before the next workload's."""
    vocab = model.spec.vocab_size
    engine = _engine(model, s)
    routed = RoutedExperts(model)
    prompt = random_prompts(vocab, 1, s.prefill_len, s.seed)[0].tolist()
    one = SamplingParams(max_tokens=1, ignore_eos=True)

    def prefill() -> None:
        engine.add_request(prompt, one)
        engine.step()

    plans = [Planned("moetune", f"prefill b=1 len={s.prefill_len}", s.prefill_len, Work(prefill),
                     flops=prefill_flops(model, s.prefill_len))]
    params = SamplingParams(max_tokens=s.decode_steps + 1, ignore_eos=True)
    for b in s.decode_batches:
        prompts = random_prompts(vocab, b, s.decode_context, s.seed + b).tolist()

        def setup(prompts=prompts) -> None:
            for p in prompts:
                engine.add_request(p, params)
            engine.step()  # the prefill, untimed; every sequence samples its first token

        steps = [0]  # engine steps of the runs so far (speculation takes fewer than decode_steps)

        def decode(_) -> None:
            with routed.counting():
                while engine.has_unfinished():  # decode_steps tokens per sequence, however many steps
                    engine.step()
                    steps[0] += 1

        def read() -> float:  # over the runs so far, warm-up included (each decodes the same tokens)
            per_run, steps[0] = steps[0] / (s.runs + WARMUP), 0
            return per_run * dense_weight_bytes(model) + routed.take() * expert_bytes(model) / (s.runs + WARMUP)

        plans.append(Planned("moetune", f"decode b={b}", b * s.decode_steps, Work(decode, setup), bytes_read=read))
    return plans, routed.detach


def bench_against(plans: list[Planned], reference: list[Planned], device: torch.device, runs: int,
                  sampler: LimitSampler | None = None) -> list[BenchRow]:
    """Each workload of ours and the reference's same workload, their runs taking turns
    (`measure_alternating`): our rows, then the reference's. With a `sampler`, each of our runs is
    preceded by a sample of the machine's limit, kept in our row."""
    if sampler is not None:
        plans = sampled_beside(plans, sampler)
    ours, theirs = [], []
    for a, b in zip(plans, reference, strict=True):
        ta, tb = measure_alternating(a.work, b.work, device, runs, warmup=WARMUP)
        ours.append(a.row(ta, sampler.median(a.workload) if sampler is not None else 0.0))
        theirs.append(b.row(tb))
    return ours + theirs


WARMUP = 1  # untimed runs before the timed ones (every run decodes the same tokens: same routing)


class RoutedExperts:
    """Counts the distinct experts each MoE layer computes per step, by wrapping the model's expert
    store while counting (the ids are kept as tensors and counted afterwards, off the clock)."""

    def __init__(self, model: MoETransformer):
        from moetune.moe.layer import MoELayer

        self.layers = [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoELayer)]
        self.store = model.experts
        self.ids: list[torch.Tensor] = []
        self.on = False
        for layer in self.layers:
            layer.store = self

    @property
    def resident(self) -> bool:
        return self.store.resident

    def acquire(self, layer: int, topk_ids: torch.Tensor):
        if self.on:
            self.ids.append(topk_ids)
        return self.store.acquire(layer, topk_ids)

    def prefetch(self, layer: int, topk_ids: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        self.store.prefetch(layer, topk_ids, hidden)

    # the rest of the ExpertStore protocol, passed through
    @property
    def settings(self):
        return self.store.settings

    @property
    def wants_hints(self) -> bool:
        return self.store.wants_hints

    def hint(self, layer: int, experts: list[int]) -> None:
        self.store.hint(layer, experts)

    def layers(self) -> list[int]:
        return self.store.layers()

    def nbytes(self) -> int:
        return self.store.nbytes()

    def bind_routers(self, routers) -> None:
        self.store.bind_routers(routers)

    def stats(self) -> dict[int, dict]:
        return self.store.stats()

    def reset_stats(self) -> None:
        self.store.reset_stats()

    def drain(self) -> None:
        self.store.drain()

    @contextlib.contextmanager
    def counting(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False

    def take(self) -> int:
        """Σ over the layer-steps recorded so far of the distinct experts routed; then forget them."""
        n = sum(int(ids.unique().numel()) for ids in self.ids)
        self.ids = []
        return n

    def detach(self) -> None:
        for layer in self.layers:
            layer.store = self.store


def _engine(model: MoETransformer, s: BenchSettings) -> Engine:
    """An engine whose step holds a whole workload: no chunking, no prefix sharing between runs."""
    B, bs = max(s.decode_batches), EngineConfig().block_size
    tokens = max(s.prefill_len, B * s.decode_context)
    lookahead = 17 if s.speculative else 1  # a verify step's draft tokens need their KV slots too
    blocks = B * -(-(max(s.prefill_len, s.decode_context + s.decode_steps) + lookahead) // bs)
    config = EngineConfig(max_num_seqs=B, max_num_batched_tokens=tokens, num_kv_blocks=blocks,
                          prefix_caching=False, chunked_prefill=False, speculative=s.speculative)
    return Engine(model, None, frozenset(), config)
