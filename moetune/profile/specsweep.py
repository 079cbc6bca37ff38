"""Speculation against plain decoding per batch size, measured by a profile with engine.speculative.

After the measured steps (the profiler detached: nothing here reaches the run's tables), the
profile's own engine decodes the first B requests at each batch size B of SWEEP_BATCHES below the
profile's batch and at the batch itself: plain decoding (the speculator switched off for those
requests) and speculative, interleaved over SWEEP_ROUNDS rounds (plain first, then speculative
first, ...), each after an untimed warm-up of WARMUP_TOKENS tokens per mode. A run is timed from
after every request's first token (its prefill) until each has min(output_len, SWEEP_TOKENS)
tokens (greedy, EOS ignored): tok/s = B · (tokens − 1) / time. The speculative runs' counters give
the acceptance and the experts a verify step wakes against the same step as a plain decode
(`engine/speculative/experts.py`). One row per batch size: summary.json `speculative.by_batch`.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

SWEEP_BATCHES = (1, 4, 16, 64)  # the batch sizes below the profile's own that are measured too
SWEEP_ROUNDS = 2  # timed runs per mode and batch size, interleaved
SWEEP_TOKENS = 32  # tokens generated per request in a timed run (at most the workload's output_len)
WARMUP_TOKENS = 4  # tokens per request of each mode's untimed run at a batch size


def sweep_batches(batch: int) -> list[int]:
    return [b for b in SWEEP_BATCHES if b < batch] + [batch]


@contextmanager
def plain_decoding(engine):
    """The engine without its speculator (and adaptive k) inside the block: plain decode steps."""
    spec, adaptive = engine.speculator, engine.adaptive
    engine.speculator, engine.adaptive = None, None
    try:
        yield engine
    finally:
        engine.speculator, engine.adaptive = spec, adaptive


def decode_seconds(engine, prompts: list[list[int]], tokens: int) -> float:
    """Add the prompts (greedy, `tokens` each), step untimed until every one has its first token,
    then time the steps until all finish."""
    from moetune.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    ids = {engine.add_request(p, params) for p in prompts}
    started: set[int] = set()
    while started != ids and engine.has_unfinished():
        started.update(out.request_id for out in engine.step())
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def speculation_sweep(engine, requests: list[list[int]], output_len: int, batch: int, expert_bytes: float) -> list[dict]:
    """One row per batch size (sweep_batches): tok/s of plain and speculative decoding per round,
    the speed-up (median, min, max of the rounds' paired ratios) and the speculative runs' summary."""
    tokens = min(output_len, SWEEP_TOKENS)
    if tokens < 2:  # no decode step to time
        return []
    return [_one_batch(engine, requests[:b], tokens, expert_bytes) for b in sweep_batches(min(batch, len(requests)))]


def _one_batch(engine, prompts: list[list[int]], tokens: int, expert_bytes: float) -> dict:
    from moetune.engine.speculative.experts import speculative_counters, speculative_summary

    def timed(plain: bool, n: int) -> float:
        if plain:
            with plain_decoding(engine):
                return decode_seconds(engine, prompts, n)
        return decode_seconds(engine, prompts, n)

    timed(True, WARMUP_TOKENS)
    timed(False, WARMUP_TOKENS)
    before = speculative_counters(engine.stats, engine.runner.experts)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for r in range(SWEEP_ROUNDS):
        for plain in ((True, False) if r % 2 == 0 else (False, True)):
            seconds[plain].append(timed(plain, tokens))
    after = speculative_counters(engine.stats, engine.runner.experts)
    decoded = len(prompts) * (tokens - 1)
    ratios = [p / s for p, s in zip(seconds[True], seconds[False])]
    summary = speculative_summary(engine.config.speculative, {k: after[k] - before[k] for k in after}, expert_bytes)
    return {"batch": len(prompts), "rounds": SWEEP_ROUNDS, "decode_tokens": decoded,
            "plain_tok_s": [decoded / t for t in seconds[True]],
            "speculative_tok_s": [decoded / t for t in seconds[False]],
            "speedup": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
            **{k: v for k, v in summary.items() if k not in ("enabled", "method")}}
