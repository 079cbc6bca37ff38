"""Throughput on a mesh of R expert-parallel (data-parallel attention) groups × G tensor-parallel
ranks: every rank runs the same calls.

prefill tokens/s = R prompts of prefill_len tokens (one per DP group) / time of the one lock-step
decode tokens/s  = batch × steps / time of `steps` lock-steps (the batch spread over the DP groups)
all-to-all share = rank 0's seconds inside dispatch + combine collectives / the timed seconds
(split-size exchange, i.e. waiting for the slowest rank, included); bytes/step = rank 0's rows that
left it per lock-step, dispatch + combine over all MoE layers.
TP share = rank 0's seconds inside the tensor-parallel all-reduces and the LM-head gather / the timed seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from moetune.bench.throughput import BenchRow, BenchSettings, random_prompts
from moetune.bench.timing import measure
from moetune.config import EngineConfig
from moetune.engine.sampling import SamplingParams


@dataclass(frozen=True)
class EPBenchRow(BenchRow):
    a2a_share: float = 0.0  # of the timed seconds, in the all-to-alls (rank 0)
    wait_share: float = 0.0  # of which waiting for the slowest rank (split-size exchange)
    bytes_per_step: float = 0.0  # rank 0, dispatch + combine
    tp_share: float = 0.0  # of the timed seconds, in the tensor-parallel collectives (rank 0)


def bench_engine_config(s: BenchSettings, ep_size: int) -> EngineConfig:
    """Each rank's engine holds its share of the largest workload in one step, no chunking, no sharing."""
    B, bs = -(-max(s.decode_batches) // ep_size), EngineConfig().block_size
    tokens = max(s.prefill_len, B * s.decode_context)
    blocks = B * -(-(max(s.prefill_len, s.decode_context + s.decode_steps) + 1) // bs)
    return EngineConfig(max_num_seqs=B, max_num_batched_tokens=tokens, num_kv_blocks=blocks,
                        prefix_caching=False, chunked_prefill=False)


def bench_ep(dp, s: BenchSettings) -> list[EPBenchRow] | None:
    """Rows on rank 0, None elsewhere. `dp` is a DPGenerator whose engine uses bench_engine_config."""
    dev, vocab, R = dp.model.device, dp.model.spec.vocab_size, dp.dp_size
    tally = _Tally(_dispatcher(dp.model), dp.model.tp)
    prompts = random_prompts(vocab, R, s.prefill_len, s.seed).tolist()
    one = SamplingParams(max_tokens=1, ignore_eos=True)

    def prefill() -> None:
        dp.engine.add_request(prompts[dp.dp_rank], one)
        dp.step()

    rows = [tally.row(f"prefill b={R} len={s.prefill_len}", R * s.prefill_len,
                      measure(tally.timed(prefill, 1, after=lambda: _drain(dp)), dev, s.runs))]
    params = SamplingParams(max_tokens=s.decode_steps + 1, ignore_eos=True)
    for b in s.decode_batches:
        batch = random_prompts(vocab, b, s.decode_context, s.seed + b).tolist()

        def setup(batch=batch) -> None:
            _drain(dp)  # the previous run's last lock-step
            for i in dp.mine(len(batch)):
                dp.engine.add_request(batch[i], params)
            dp.step()  # the prefill, untimed

        def decode(_) -> None:
            for _ in range(s.decode_steps):
                dp.step()

        tally.reset()
        timing = measure(tally.timed(decode, s.decode_steps), dev, s.runs, setup=setup)
        _drain(dp)
        rows.append(tally.row(f"decode b={b}", b * s.decode_steps, timing))
    return rows if dp.rank == 0 else None


class _Tally:
    """Rank 0's all-to-all seconds and bytes inside the timed calls (warm-up included)."""

    def __init__(self, dispatcher, tp=None):
        self.dispatcher, self.tp = dispatcher, tp  # tp: the model's TPComm (None without TP)
        self.reset()

    def reset(self) -> None:
        self.seconds = self.a2a = self.wait = self.tp_s = 0.0
        self.bytes = self.steps = 0

    def timed(self, fn, steps: int, after=None):
        def run(*args):
            d = self.dispatcher
            w, t, b, c = _stats(d) + (self._tp_seconds(),)
            start = time.perf_counter()
            fn(*args)
            self.seconds += time.perf_counter() - start
            w2, t2, b2 = _stats(d)
            self.wait += w2 - w
            self.a2a += w2 - w + t2 - t
            self.bytes += b2 - b
            self.tp_s += self._tp_seconds() - c
            self.steps += steps
            if after is not None:
                after()
        return run

    def row(self, workload: str, tokens: int, timing) -> EPBenchRow:
        secs = max(self.seconds, 1e-12)
        row = EPBenchRow("moetune", workload, tokens, timing, a2a_share=self.a2a / secs, wait_share=self.wait / secs,
                         bytes_per_step=self.bytes / max(self.steps, 1), tp_share=self.tp_s / secs)
        self.reset()
        return row

    def _tp_seconds(self) -> float:
        return self.tp.seconds if self.tp is not None else 0.0


def _stats(dispatcher) -> tuple[float, float, int]:
    """(wait, transfer seconds, bytes sent) so far; zeros for the local dispatcher (no EP)."""
    return (getattr(dispatcher, "wait_s", 0.0), getattr(dispatcher, "transfer_s", 0.0),
            getattr(dispatcher, "bytes_sent", 0))


def _drain(dp) -> None:
    while dp.step() is not None:
        pass


def _dispatcher(model):
    from moetune.moe.layer import MoELayer

    return next(layer.mlp.dispatcher for layer in model.layers if isinstance(layer.mlp, MoELayer))
