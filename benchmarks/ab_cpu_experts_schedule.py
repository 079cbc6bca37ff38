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

import statistics

from ab_blocks import alternate, arguments, decoding_engine, load, ratios, threads


def main() -> None:
    p = arguments(__doc__, [1, 16])
    p.add_argument("--experts", choices=["fp32", "int8"], default="fp32")
    args = p.parse_args()

    threads(args.threads)
    from moetune.kernels.cpu import experts as kernel

    for batch in args.batch:
        model = load(args.model)
        if args.experts == "int8":
            from bench_cpu_decode import quantize_experts

            quantize_experts(model, "int8")
        engine = decoding_engine(model, batch, 2, args.blocks)
        times = alternate(engine, ("split", "auto"), args.blocks, lambda side: setattr(kernel, "SCHEDULE", side))
        kernel.SCHEDULE = "auto"
        print(f"{args.model} b={batch} {args.experts}: split {statistics.median(times['split']) * 1e3:.2f} ms, "
              f"auto {statistics.median(times['auto']) * 1e3:.2f} ms, split/auto per block pair: "
              f"{ratios(times['split'], times['auto'])}")


if __name__ == "__main__":
    main()
