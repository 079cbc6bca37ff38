"""In-process A/B of the int4 numerics modes at decode (docs/cpu.md, "Int4 in interleaved blocks"):
the default (2 parts of x + fp16 scales up to 16 rows, 3 + fp32 beyond), llama.cpp's (1 part, fp16
scales) and the exact mode (2 / 3 parts, fp32 scales), each a model of its own loaded with its
switches set (the repacked copy's scales are made at load), decoding the same batch.

  python benchmarks/make_cpu_bench_models.py mixtral /tmp/m364
  moetune quantize -m /tmp/m364 --policy int4-g32 --dense int4-g32 -o /tmp/m364-int4
  python benchmarks/ab_q4_modes.py --model /tmp/m364-int4 --batch 1 [--blocks 12] [--threads 2]

The modes take turns in blocks of 6 timed decode steps (one untimed step after each switch; the order
rotates every round), so the machine's drift cancels in the ratios. Prints each mode's median step (ms,
tok/s) and its step time ÷ llama.cpp's numerics' per round (median, interquartile, min, max), with the
load before and after.
"""

from __future__ import annotations

import os
import statistics
import time

from ab_blocks import TIMED, arguments, decoding_engine, load, ratios, threads

MODES = {  # (Q4_X_PARTS_FEW, Q4_X_PARTS, Q4_SCALE_FP16_FEW, Q4_SCALE_FP16)
    "default": (2, 3, True, False),
    "llama.cpp": (1, 1, True, True),
    "exact": (2, 3, False, False),
}


def set_mode(name: str) -> None:
    from moetune.kernels.cpu import runtime

    (runtime.Q4_X_PARTS_FEW, runtime.Q4_X_PARTS, runtime.Q4_SCALE_FP16_FEW,
     runtime.Q4_SCALE_FP16) = MODES[name]


def turns(engines: dict, blocks: int) -> dict[str, list[float]]:
    """mode → each of its blocks' median decode step (s), the modes in rotating order."""
    names = list(engines)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(blocks):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            set_mode(name)
            engines[name].step()  # untimed: the switch
            one = []
            for _ in range(TIMED):
                start = time.perf_counter()
                engines[name].step()
                one.append(time.perf_counter() - start)
            times[name].append(statistics.median(one))
    return times


def main() -> None:
    args = arguments(__doc__, [1]).parse_args()
    threads(args.threads)
    for batch in args.batch:
        engines = {}
        for name in MODES:
            set_mode(name)
            engines[name] = decoding_engine(load(args.model), batch, len(MODES), args.blocks)
        load_before = os.getloadavg()
        times = turns(engines, args.blocks)
        med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
        print(f"{args.model} b={batch} threads={args.threads} load {load_before} → {os.getloadavg()}: "
              + ", ".join(f"{n} {m:.3f} ms ({batch * 1e3 / m:.1f} tok/s)" for n, m in med.items()))
        for name in ("default", "exact"):
            print(f"  {name} ÷ llama.cpp's numerics, step time per block round: {ratios(times[name], times['llama.cpp'])}")


if __name__ == "__main__":
    main()
