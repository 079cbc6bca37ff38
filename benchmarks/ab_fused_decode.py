"""In-process A/B of the fused CPU decode step (two kernel calls per layer, `FusedDecode._layer`)
against the unfused layer. At commit 8e60362 this script also ran every layer in one `decode_layers`
call (the "one-call" side): per-layer ÷ one-call 0.999-1.049 (docs/cpu.md), so that mode was dropped.

  python benchmarks/ab_fused_decode.py --model stdlib-moe --batch 8 [--blocks 12] [--threads 2]
  python benchmarks/ab_fused_decode.py --model /tmp/m340 --batch 1     # make_cpu_bench_models.py mixtral

One engine decodes; the path alternates in blocks of 6 decode steps (fused, unfused, unfused,
fused, ...), one untimed step after each switch. Each block's median step time is paired with the
neighbouring block of the other side, so the machine's drift (tens of percent over minutes on a
shared VM) cancels. Prints each side's median step time and the unfused ÷ fused ratio per block
pair (median, interquartile, min, max), with the load average before and after.
"""

from __future__ import annotations

import os
import statistics

from ab_blocks import alternate, arguments, decoding_engine, load, ratios, threads

SIDES = ("fused", "unfused")


def main() -> None:
    args = arguments(__doc__, [8]).parse_args()

    threads(args.threads)
    for batch in args.batch:
        model = load(args.model)
        fused = model.fused
        assert fused is not None, "the fused decode path does not apply to this model (fp32, cpu backend)"
        engine = decoding_engine(model, batch, len(SIDES), args.blocks)
        load_before = os.getloadavg()

        def switch(side: str) -> None:
            model.fused = fused if side == "fused" else None

        times = alternate(engine, SIDES, args.blocks, switch)
        model.fused = fused
        med = {s: statistics.median(v) * 1e3 for s, v in times.items()}
        print(f"{args.model} b={batch} threads={args.threads} load {load_before} → {os.getloadavg()}: "
              + ", ".join(f"{s} {m:.2f} ms" for s, m in med.items()))
        print(f"  unfused / fused per block pair: {ratios(times['unfused'], times['fused'])}")


if __name__ == "__main__":
    main()
