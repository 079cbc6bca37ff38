"""Output tokens/s of the engine on held-out prompts, all submitted at once (issue 13's bundled-model check).

  python benchmarks/bench_engine_cpu.py [--model NAME|DIR] [--prompts 8 64] [--tokens 64] [--max-prompt 256]
      [--runs 2] [--kernel-backend auto|torch|cpu]

Workload: the bundled held-out prompts, tokenized and truncated to `--max-prompt` tokens, the first
N of them, each asking for `--tokens` greedy tokens (EOS ignored), all added before the first step;
the engine runs until every request is done (prefill and decode, continuous batching, max_num_seqs
= N). output tok/s = N × tokens / wall time. One untimed warm-up round, then `--runs` timed rounds
per N: every round is printed, with the median and the spread (max − min) / median, and the load
average (`/proc/loadavg`) before each round, as the machine may be shared.

Runs on any checkout of moetune (it passes `kernel_backend` only when asked), so the same script
measures the engine before and after a change: `PYTHONPATH=/path/to/other/checkout python ...`.
"""

from __future__ import annotations

import argparse
import statistics
import time


def load_avg() -> str:
    return open("/proc/loadavg").read().split()[0]


def one_round(engine, prompts: list[list[int]], tokens: int) -> tuple[float, int]:
    from moetune.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    for ids in prompts:
        engine.add_request(ids, params)
    out = 0
    while engine.has_unfinished():
        out += len(engine.step())
    return time.perf_counter() - start, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, nargs="+", default=[8, 64])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--kernel-backend", default=None)
    args = p.parse_args()
    from moetune.engine.heap import heap_policy, keep_freed_memory
    from moetune.engine.threads import choose_wait_policy, wait_policy

    choose_wait_policy()  # as moetune's CLI does (docs/cpu.md); before torch
    keep_freed_memory()  # as the CLI does (engine/heap.py)
    print(f"OpenMP wait: {wait_policy()} · freed memory: {heap_policy()}")

    import torch

    import moetune
    from moetune.config import RunConfig
    from moetune.engine.build import build_generator
    from moetune.model.registry import bundled_asset
    from moetune.profile.workload import load_prompt_texts

    texts = load_prompt_texts(bundled_asset("prompts/stdlib-heldout.jsonl"))
    model = {"path": args.model} | ({"kernel_backend": args.kernel_backend} if args.kernel_backend else {})
    N = max(args.prompts)
    cfg = RunConfig(model=model, engine={"max_num_seqs": N, "prefix_caching": False})
    generator = build_generator(cfg)
    engine = generator.engine
    prompts = [generator.encode(t)[: args.max_prompt] for t in texts[:N]]
    backend = next((l.mlp.backend.name for l in generator.model.layers if hasattr(l.mlp, "backend")), "-")
    print(f"moetune at {moetune.__file__} · backend {backend} · torch threads {torch.get_num_threads()} · "
          f"{N} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens")
    one_round(engine, prompts[:8], 8)  # warm-up
    for n in args.prompts:
        rates = []
        for run in range(args.runs):
            load = load_avg()
            wall, out = one_round(engine, prompts[:n], args.tokens)
            rates.append(out / wall)
            print(f"  prompts {n:>3} run {run}: {out} tokens in {wall:6.2f} s = {out / wall:8.1f} out tok/s "
                  f"(load avg before: {load})")
        med = statistics.median(rates)
        print(f"prompts {n:>3} × {args.tokens} tokens: median {med:,.1f} out tok/s, "
              f"spread {(max(rates) - min(rates)) / med:.1%} over {args.runs} runs")


if __name__ == "__main__":
    main()
