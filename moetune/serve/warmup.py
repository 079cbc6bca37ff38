"""`moetune serve`'s warm-up: before the server listens, the engine runs, on the thread that will step
it, the kinds of step its first requests need, so that none of them pays for a first call.

numba compiles a CPU kernel (or loads it from its disk cache) on its first call with each set of
argument types, and the row count of a step picks among kernels (the integer paths up to 16 x rows,
the LM head on torch's GEMM beyond): the model's load warms one decode token only
(model/fused_decode.py), so a prefill, a prompt longer than a KV block, a decode of many rows or a
prefix-cache hit used to compile on the first request that needed it (e.g. `_jit_rows.rope_rotate_half`
on a prefill's strided heads, during the first timed load of docs/benchmarks.md).

The requests (synthetic token ids, `warm_plan`): one short prompt alone (a prefill of a few tokens,
decodes of one row); then `max_num_seqs` at once, prompts from a few tokens to a few hundred,
every sampling path (greedy, temperature with top-k / top-p / a seed, logprobs) and max_tokens
spread so that the decode steps shrink from every slot to a few rows; while they decode, a prompt
sharing blocks with an earlier one (a mixed step with a prefix-cache hit). The engine then forgets
them: empty queues, a fresh block pool and prefix cache, zeroed counters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from moetune.engine.engine import Engine, EngineStats
from moetune.engine.sampling import SamplingParams
from moetune.errors import RequestError
from moetune.kernels.cpu.runtime import compiled_signatures

PROMPT_LENS = (5, 17, 48, 130, 300)  # tokens; a block is 16 by default: one block, partial, several
MAX_TOKENS = (2, 3, 4, 5, 6, 8)  # the finishing steps spread the batch's decode rows down to a few
PARAMS = (SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=7),
          SamplingParams(temperature=1.0, top_k=40), SamplingParams(logprobs=2),
          SamplingParams(temperature=0.7, top_k=20, top_p=0.95, logprobs=1, seed=3))


@dataclass(frozen=True)
class WarmReport:
    seconds: float
    steps: int
    requests: int
    signatures: int  # kernel type signatures compiled or loaded from numba's cache during the warm-up

    def line(self) -> str:
        return (f"warm-up {self.seconds:.1f} s ({self.requests} requests, {self.steps} steps, "
                f"{self.signatures} kernel signatures)")


@dataclass(frozen=True)
class WarmRequest:
    prompt: list[int]
    params: SamplingParams
    after_steps: int = 0  # added once the warm-up's group has taken this many steps


def warm_plan(vocab: int, max_len: int, rows: int) -> list[list[WarmRequest]]:
    """The warm-up's groups of requests, run one after the other: one short prompt alone, then `rows`
    requests at once (and one more that arrives while they decode)."""
    def ids(n: int, salt: int) -> list[int]:
        n = max(1, min(n, max_len - max(MAX_TOKENS) - 2))
        return [1 + (salt * 7919 + j * 104729) % (vocab - 1) for j in range(n)]

    def params(i: int) -> SamplingParams:
        p = PARAMS[i % len(PARAMS)]
        return SamplingParams(max_tokens=MAX_TOKENS[i % len(MAX_TOKENS)], temperature=p.temperature,
                              top_k=p.top_k, top_p=p.top_p, seed=p.seed, logprobs=p.logprobs, ignore_eos=True)

    alone = [WarmRequest(ids(4, 0), SamplingParams(max_tokens=4, ignore_eos=True))]
    group = [WarmRequest(ids(PROMPT_LENS[i % len(PROMPT_LENS)], i + 1), params(i)) for i in range(rows)]
    shared = group[-1].prompt if len(group[-1].prompt) > 32 else ids(130, rows)
    late = WarmRequest(shared + ids(9, rows + 1), params(rows), after_steps=2)  # shares the earlier blocks
    return [alone, group + [late]]


def warm_engine(engine: Engine) -> WarmReport:
    """Run `warm_plan` through `engine` (on the calling thread: the one that will step it), then make it
    forget the requests; → what it took."""
    before, t0 = compiled_signatures(), time.perf_counter()
    plan = warm_plan(engine.model.spec.vocab_size, engine.max_len, engine.config.max_num_seqs)
    ran = [_run_group(engine, group) for group in plan]  # [(steps, requests)]
    forget(engine)
    after = compiled_signatures()
    added = sum(n - before.get(name, 0) for name, n in after.items())
    return WarmReport(time.perf_counter() - t0, sum(s for s, _ in ran), sum(n for _, n in ran), added)


def _run_group(engine: Engine, group: list[WarmRequest]) -> tuple[int, int]:
    """Step the engine until `group` is done (each request added at its `after_steps`; one this engine
    could never run, e.g. a prompt over max_num_batched_tokens without chunked prefill, is left out);
    → (steps taken, requests run)."""
    pending = sorted(group, key=lambda r: r.after_steps)
    steps = added = 0
    while pending or engine.has_unfinished():
        while pending and pending[0].after_steps <= steps:
            r = pending.pop(0)
            try:
                engine.add_request(r.prompt, r.params)
                added += 1
            except RequestError:
                continue
        engine.step()
        steps += 1
    return steps, added


def forget(engine: Engine) -> None:
    """The engine as if it had served nothing: no requests, a fresh block pool and prefix cache, zeroed
    counters (what /metrics shows), and an adaptive speculation k without the warm-up's step times."""
    engine.reset()
    engine.stats = EngineStats()
    engine.scheduler.num_preemptions = 0
    engine.scheduler.cached_tokens = 0
    if engine.adaptive is not None:
        engine.adaptive = type(engine.adaptive)(engine.adaptive.k_max)
