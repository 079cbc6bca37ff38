"""Quant mix and offloading on one checkpoint: the two tables of issue 11's closing note.

  python benchmarks/bench_quant_offload.py [--model DIR|NAME] --loads RUN_DIR [--part quant|offload|both]
      [--windows 8] [--prompts 16] [--decode-steps 32] [--runs 3] [--offload-dir DIR]

quant table, per mix (all fp32 / all int8 / all int4-g64 / hot 25 % fp32 + rest int4-g64 /
hot 25 % int8 + rest int4-g64; hot = by the expert loads of RUN_DIR, a `moetune profile` run):
  ppl        held-out perplexity (`moetune eval`'s protocol, first --windows windows of 512 tokens)
  KL, top-1  vs the fp32 model over every position of --prompts held-out prompts (128 tokens max)
  greedy     fraction of prompts whose 16 greedy tokens equal the fp32 model's
  expert MB  bytes of the resident routed experts (data + scales)
  decode     tokens/s, batch 1, median of --runs runs of --decode-steps engine steps after a prefill
offload table, per tier (host, disk) × resident capacity (25/50/75/100 % of E) × prefetch depth 0–3:
  hit rate, prefetch precision (over the decode steps only: counters reset after the prefill), decode tokens/s.
  Disk reads go through preadv with posix_fadvise(DONTNEED) after each read, so the page cache is dropped.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from moetune.bench.quality import EvalSettings, agreement, encode_prompts, perplexity
from moetune.config import parse_config
from moetune.engine.build import build_generator
from moetune.engine.sampling import SamplingParams
from moetune.model.registry import bundled_asset
from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

MIXES = {
    "all fp32": {"experts": "fp32"},
    "all int8": {"experts": "int8"},
    "all int4-g64": {"experts": "int4-g64"},
    "hot 25% fp32 + int4-g64": {"hot_fraction": 0.25, "high": "fp32", "low": "int4-g64"},
    "hot 25% int8 + int4-g64": {"hot_fraction": 0.25, "high": "int8", "low": "int4-g64"},
}


def decode_rate(gen, prompt: list[int], steps: int, runs: int, store=None) -> tuple[float, dict | None]:
    """Median decode tokens/s (batch 1) and, for an offloading store, its counters over the last run."""
    rates, stats = [], None
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    for _ in range(runs + 1):  # the first run warms up
        rid = gen.engine.add_request(prompt, params)
        gen.engine.step()  # prefill, untimed
        if store is not None:
            store.drain()
            store.reset_stats()
        start = time.perf_counter()
        for _ in range(steps):
            gen.engine.step()
        rates.append(steps / (time.perf_counter() - start))
        gen.engine.abort(rid)
        if store is not None:
            stats = store.stats()
    return statistics.median(rates[1:]), stats


def quant_table(model: str, loads: str, s: EvalSettings, steps: int, runs: int) -> None:
    base = {"model": {"path": model}, "engine": {"prefix_caching": False}}
    ref = build_generator(parse_config(base))
    body = bundled_asset("eval/heldout-sample.txt").read_text()
    prompts = encode_prompts(ref, load_prompt_texts(prompts_path(Workload())), s)
    print("| mix | ppl | KL (nats) | top-1 agr. | greedy match | expert MB | decode tok/s (b=1) |")
    print("|---|---|---|---|---|---|---|")
    for name, quant in MIXES.items():
        if "hot_fraction" in quant:
            quant = {**quant, "loads": loads}
        gen = build_generator(parse_config({**base, "quant": quant}))
        ppl = perplexity(gen, gen.encode(body), s)["ppl"]
        a = agreement(gen, ref, prompts, s)
        rate, _ = decode_rate(gen, prompts[0], steps, runs)
        print(f"| {name} | {ppl:.3f} | {a['kl']:.5f} | {a['top1_agreement']:.4f} | {a['greedy_match']:.3f} | "
              f"{gen.model.experts.nbytes() / 1e6:.2f} | {rate:.1f} |", flush=True)
        del gen
        gc.collect()


def offload_table(model: str, s: EvalSettings, steps: int, runs: int, offload_dir: str | None) -> None:
    base = {"model": {"path": model}, "engine": {"prefix_caching": False}}
    ref = build_generator(parse_config(base))
    prompt = encode_prompts(ref, load_prompt_texts(prompts_path(Workload())), s)[0]
    E = ref.model.spec.moe.num_experts
    resident, _ = decode_rate(ref, prompt, steps, runs)
    print(f"resident (every expert on the device): {resident:.1f} tok/s")
    print("| tier | resident | depth | hit rate | prefetch precision | decode tok/s (b=1) |")
    print("|---|---|---|---|---|---|")
    for tier in ("host", "disk"):
        for frac in (0.25, 0.5, 0.75, 1.0):
            for depth in range(4):
                off = {"resident_fraction": frac, "prefetch_depth": depth, "tier": tier, "policy": "lru"}
                if tier == "disk" and offload_dir:
                    off["dir"] = offload_dir
                gen = build_generator(parse_config({**base, "offload": off}))
                rate, stats = decode_rate(gen, prompt, steps, runs, gen.model.experts)
                hits = sum(r["hits"] for r in stats.values())
                looked = hits + sum(r["misses"] for r in stats.values())
                issued = sum(r["prefetch_issued"] for r in stats.values())
                used = sum(r["prefetch_used"] for r in stats.values())
                prec = f"{used / issued:.2f}" if issued else "–"
                cap = stats[next(iter(stats))]["capacity"]
                print(f"| {tier} | {int(100 * frac)}% ({cap}/{E}) | {depth} | {hits / max(1, looked):.3f} | {prec} | "
                      f"{rate:.1f} |", flush=True)
                gen.model.experts.close()
                del gen
                gc.collect()  # the engine and model refer to each other: free this model before the next


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="stdlib-moe")
    ap.add_argument("--loads", help="run directory of moetune profile (for the hot-fraction mixes)")
    ap.add_argument("--part", choices=("quant", "offload", "both"), default="both")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--offload-dir")
    args = ap.parse_args()
    s = EvalSettings(max_windows=args.windows, num_prompts=args.prompts)
    if args.part in ("quant", "both"):
        if not args.loads:
            ap.error("--loads RUN_DIR is needed for the hot-fraction mixes")
        quant_table(args.model, args.loads, s, args.decode_steps, args.runs)
    if args.part in ("offload", "both"):
        offload_table(args.model, s, args.decode_steps, args.runs, args.offload_dir)


if __name__ == "__main__":
    main()
