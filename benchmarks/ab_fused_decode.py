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

import argparse
import os
import statistics
import time

SIDES = ("fused", "unfused")




def _ratios(a: list[float], b: list[float]) -> str:
    r = sorted(x / y for x, y in zip(a, b))
    q = len(r) // 4
    return f"{statistics.median(r):.3f} [{r[q]:.3f}-{r[-1 - q]:.3f}] min {r[0]:.3f} max {r[-1]:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[8])
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

    for batch in args.batch:
        model = build_model(parse_config({"model": {"path": args.model}}, source="ab"))
        fused = model.fused
        assert fused is not None, "the fused decode path does not apply to this model (fp32, cpu backend)"
        steps = 10 + len(SIDES) * args.blocks * 7
        engine = _engine(model, BenchSettings(decode_batches=(batch,), decode_context=32, decode_steps=steps))
        for prompt in random_prompts(model.spec.vocab_size, batch, 32, 1).tolist():
            engine.add_request(prompt, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
        for _ in range(10):
            engine.step()
        load_before = os.getloadavg()
        times: dict[str, list[float]] = {s: [] for s in SIDES}
        for block in range(len(SIDES) * args.blocks):
            side = SIDES[(block + block // len(SIDES)) % len(SIDES)]
            model.fused = fused if side == "fused" else None
            engine.step()  # untimed: the switch
            one = []
            for _ in range(6):
                start = time.perf_counter()
                engine.step()
                one.append(time.perf_counter() - start)
            times[side].append(statistics.median(one))
        model.fused = fused
        med = {s: statistics.median(v) * 1e3 for s, v in times.items()}
        print(f"{args.model} b={batch} threads={args.threads} load {load_before} → {os.getloadavg()}: "
              + ", ".join(f"{s} {m:.2f} ms" for s, m in med.items()))
        print(f"  unfused / fused per block pair: {_ratios(times['unfused'], times['fused'])}")


if __name__ == "__main__":
    main()
