"""What the in-process A/B benchmarks share (ab_fused_decode.py, ab_cpu_experts_schedule.py): one engine
decoding a batch, the two sides alternating in blocks of 6 timed decode steps (one untimed step after each
switch; the order flips every block: a b b a a b ...), and each block's median paired with the
neighbouring block of the other side, so the machine's drift (tens of percent over minutes on a shared
VM) cancels in the ratios."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

WARMUP_STEPS = 10
TIMED = 6  # timed steps per block


def arguments(doc: str, batch: list[int]) -> argparse.ArgumentParser:
    """The options every A/B takes: --model, --batch (one or more), --blocks, --threads."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=batch)
    p.add_argument("--blocks", type=int, default=12, help=f"blocks of {TIMED} steps per side")
    p.add_argument("--threads", type=int, default=2)
    return p


def threads(n: int) -> None:
    """The CPU threads and OpenMP wait policy, before torch's runtime starts."""
    from moetune.engine.threads import choose_wait_policy, use_threads

    choose_wait_policy()
    use_threads(n)


def load(path: str):
    """The checkpoint built as `moetune` builds it (the recipe defaults)."""
    from moetune.config import parse_config
    from moetune.engine.build import build_model

    return build_model(parse_config({"model": {"path": path}}, source="ab"))


def decoding_engine(model, batch: int, sides: int, blocks: int):
    """An engine with `batch` 32-token prompts prefilled and warmed up, holding enough steps for the blocks."""
    from moetune.bench.throughput import BenchSettings, _engine, random_prompts
    from moetune.engine.sampling import SamplingParams

    steps = WARMUP_STEPS + sides * blocks * (TIMED + 1)
    engine = _engine(model, BenchSettings(decode_batches=(batch,), decode_context=32, decode_steps=steps))
    for prompt in random_prompts(model.spec.vocab_size, batch, 32, 1).tolist():
        engine.add_request(prompt, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    for _ in range(WARMUP_STEPS):
        engine.step()
    return engine


def alternate(engine, sides: tuple[str, ...], blocks: int, switch: Callable[[str], None]) -> dict[str, list[float]]:
    """side → each of its blocks' median decode step (s); `switch(side)` puts the engine on a side."""
    times: dict[str, list[float]] = {s: [] for s in sides}
    for block in range(len(sides) * blocks):
        side = sides[(block + block // len(sides)) % len(sides)]
        switch(side)
        engine.step()  # untimed: the switch
        one = []
        for _ in range(TIMED):
            start = time.perf_counter()
            engine.step()
            one.append(time.perf_counter() - start)
        times[side].append(statistics.median(one))
    return times


def ratios(a: list[float], b: list[float]) -> str:
    """a ÷ b per block pair: median [interquartile] min max."""
    r = sorted(x / y for x, y in zip(a, b))
    q = len(r) // 4
    return f"{statistics.median(r):.3f} [{r[q]:.3f}-{r[-1 - q]:.3f}] min {r[0]:.3f} max {r[-1]:.3f}"
