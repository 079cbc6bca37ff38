"""Continuous batching vs a static batch, through the same Engine on the same requests (CPU or GPU).

  python benchmarks/bench_continuous_batching.py [--model DIR|NAME] [--requests 64] [--batch 16]
      [--min-out 16] [--max-out 256] [--runs 2] [--random-prompts]

Workload: the bundled held-out prompts (tokenized by the model's tokenizer; `--random-prompts`
draws token ids of the same lengths instead, for checkpoints without a tokenizer), cycled to
`--requests`, each with an output length drawn uniformly from [min-out, max-out] (seeded), greedy,
EOS ignored, all submitted at t = 0.

  static     : groups of `--batch` requests in order; a group starts when the previous one has
               fully finished (the engine before continuous batching: one prefill, decode until the
               longest is done); a request's latency ends when its group ends (results are
               returned together)
  continuous : all requests queued; at most `--batch` run at once; a finished sequence's place
               is taken by the next request in the following step; latency ends at its last token

  requests/s = requests / wall time     output tok/s = generated tokens / wall time
  latency    = mean and P99 over requests of (finish − submit)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch


def workload(generator, n: int, lo: int, hi: int, random_prompts: bool, max_prompt: int) -> list[tuple[list[int], int]]:
    from moetune.model.registry import bundled_asset
    from moetune.profile.workload import load_prompt_texts

    texts = load_prompt_texts(bundled_asset("prompts/stdlib-heldout.jsonl"))
    rng = random.Random(0)
    out = []
    for i in range(n):
        if random_prompts:
            ids = [rng.randrange(3, generator.model.spec.vocab_size) for _ in range(rng.randint(16, max_prompt))]
        else:
            ids = generator.encode(texts[i % len(texts)])[:max_prompt]
        out.append((ids, rng.randint(lo, hi)))
    return out


def run_static(engine, requests, batch: int) -> tuple[float, list[float], int]:
    from moetune.engine.sampling import SamplingParams

    start, latencies, tokens = time.perf_counter(), [], 0
    for g in range(0, len(requests), batch):
        for ids, n in requests[g : g + batch]:
            engine.add_request(ids, SamplingParams(max_tokens=n, ignore_eos=True))
        while engine.has_unfinished():
            tokens += len(engine.step())
        done = time.perf_counter() - start
        latencies += [done] * len(requests[g : g + batch])
    return time.perf_counter() - start, latencies, tokens


def run_continuous(engine, requests) -> tuple[float, list[float], int]:
    from moetune.engine.sampling import SamplingParams

    start = time.perf_counter()
    rids = [engine.add_request(ids, SamplingParams(max_tokens=n, ignore_eos=True)) for ids, n in requests]
    finished, tokens = {}, 0
    while engine.has_unfinished():
        outs = engine.step()
        tokens += len(outs)
        now = time.perf_counter() - start
        for o in outs:
            if o.finish_reason is not None:
                finished[o.request_id] = now
    return time.perf_counter() - start, [finished[r] for r in rids], tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--min-out", type=int, default=16)
    p.add_argument("--max-out", type=int, default=256)
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--random-prompts", action="store_true")
    args = p.parse_args()

    from moetune.config import RunConfig
    from moetune.engine.build import build_generator

    cfg = RunConfig(model={"path": args.model}, engine={"max_num_seqs": args.batch, "prefix_caching": False})
    generator = build_generator(cfg)
    engine = generator.engine
    requests = workload(generator, args.requests, args.min_out, args.max_out, args.random_prompts, args.max_prompt)
    run_continuous(engine, requests[: args.batch])  # warm-up
    print(f"model {generator.model.spec.model_type} · {len(requests)} requests · batch {args.batch} · "
          f"out {args.min_out}-{args.max_out} · torch threads {torch.get_num_threads()}")
    print(f"{'mode':<11} {'run':>3} {'wall s':>8} {'req/s':>7} {'out tok/s':>9} {'mean lat s':>10} {'P99 lat s':>9}")
    results: dict[str, list[float]] = {"static": [], "continuous": []}
    for run in range(args.runs):
        for mode in ("static", "continuous"):
            wall, lat, tokens = run_static(engine, requests, args.batch) if mode == "static" else run_continuous(engine, requests)
            results[mode].append(tokens / wall)
            print(f"{mode:<11} {run:>3} {wall:>8.2f} {len(requests) / wall:>7.2f} {tokens / wall:>9.1f} "
                  f"{statistics.mean(lat):>10.2f} {np.percentile(lat, 99):>9.2f}")
    s, c = statistics.median(results["static"]), statistics.median(results["continuous"])
    print(f"continuous / static output tok/s (medians): {c / s:.2f}x")


if __name__ == "__main__":
    main()
