"""In-process A/B of the CPU experts kernel's work split: whole experts per thread vs column blocks.

  python benchmarks/ab_cpu_experts_schedule.py --model /tmp/m340 --batch 1 16 [--experts int8] [--blocks 12]

One engine decodes; the schedule (`moetune.kernels.cpu.experts.SCHEDULE`) alternates between
`split` (column-block items, a barrier between the w13 and the w2 pass) and `auto` (the default:
whole experts per thread when the active experts split evenly over the threads or number at least 4
per thread) in blocks of 6 decode steps, the order flipping every block. Each block's median step
time is paired with the neighbouring block of the other side, so the machine's drift (tens of
percent over minutes on a shared VM) cancels. Prints the median step times and the split ÷ auto
ratio per block pair (median, interquartile, min, max). Models: `make_cpu_bench_models.py`.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--experts", choices=["fp32", "int8"], default="fp32")
    p.add_argument("--blocks", type=int, default=12, help="blocks of 6 steps per side")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    from moetune.engine.threads import choose_wait_policy, use_threads

    choose_wait_policy()
    use_threads(args.threads)
    from moetune.bench.throughput import BenchSettings, _engine, random_prompts
    from moetune.config import parse_config
    from moetune.engine.build import build_model
    from moetune.engine.sampling import SamplingParams
    from moetune.kernels.cpu import experts as kernel

    for batch in args.batch:
        model = build_model(parse_config({"model": {"path": args.model}}, source="ab"))
        if args.experts == "int8":
            from bench_cpu_decode import quantize_experts

            quantize_experts(model, "int8")
        steps = 10 + 2 * args.blocks * 7  # warm-up, then per block one switch step and six timed ones
        engine = _engine(model, BenchSettings(decode_batches=(batch,), decode_context=32, decode_steps=steps))
        for prompt in random_prompts(model.spec.vocab_size, batch, 32, 1).tolist():
            engine.add_request(prompt, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
        for _ in range(10):
            engine.step()
        times: dict[str, list[float]] = {"split": [], "auto": []}
        for block in range(2 * args.blocks):
            side = ("split", "auto")[(block + block // 2) % 2]  # split auto auto split split auto ...
            kernel.SCHEDULE = side
            engine.step()  # untimed: the switch
            steps = []
            for _ in range(6):
                start = time.perf_counter()
                engine.step()
                steps.append(time.perf_counter() - start)
            times[side].append(statistics.median(steps))
        kernel.SCHEDULE = "auto"
        ratios = sorted(a / b for a, b in zip(times["split"], times["auto"]))
        q = len(ratios) // 4
        print(f"{args.model} b={batch} {args.experts}: split {statistics.median(times['split']) * 1e3:.2f} ms, "
              f"auto {statistics.median(times['auto']) * 1e3:.2f} ms, split/auto per block pair: median "
              f"{statistics.median(ratios):.3f} [{ratios[q]:.3f}-{ratios[-1 - q]:.3f}] min {ratios[0]:.3f} "
              f"max {ratios[-1]:.3f}")


if __name__ == "__main__":
    main()
