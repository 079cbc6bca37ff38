"""The cluster cases of the search (estimated, on the simulator): Mixtral-8x7B and Qwen3-30B-A3B on
8×H200, DeepSeek-V3 on 8 and 16×H200; input 1,024 / output 256 tokens; TTFT ≤ 1 s and TPOT ≤ 50 ms
(medians, the study's constraints) in a steady state (closed loop at each concurrency per replica).
For each case and concurrency: the winner, tok/s per GPU, TTFT/TPOT P50 and P99, memory per GPU,
its phase breakdown, and the time each simulated trial took (median, P99).

  python benchmarks/bench_cluster_cases.py --trace RUN [--trials 30] [--concurrency 256 1024]
      [--scale-routing stats|blocks|loads:FILE]   (how the trace's routing is scaled: search/cost/scale.py)

Every figure is an estimate. Public reference points (their own conditions; not the same workload):
SGLang's large-scale EP DeepSeek-V3 (96 H100, prefill/decode disaggregated) ~2.8k output tok/s per
H100 in decode; vLLM wide-EP DeepSeek ~2.2k output tok/s per H200; Mixtral-8x7B on 4×A100 3,200
tok/s at 28 ms P50 decode.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [("Mixtral-8x7B", "mixtral-8x7b.json", "8xH200"), ("Qwen3-30B-A3B", "qwen3-30b-a3b.json", "8xH200"),
         ("DeepSeek-V3", "deepseek-v3.json", "8xH200"), ("DeepSeek-V3", "deepseek-v3.json", "16xH200")]


def run_case(trace: str, config: str, hardware: str, concurrency: int, trials: int, out: Path,
             scale_routing: str | None = None):
    from moetune.search.study.optuna_study import Constraints, StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    times, last = [], [time.perf_counter()]

    def on_trial(row, done):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    inputs = Inputs(trace, hardware, scale_model=str(ROOT / "recipes/scale" / config), input_len=1024, output_len=256,
                    num_requests=4 * concurrency, concurrency=concurrency, scale_routing=scale_routing)
    st = StudySettings("cases", f"sqlite:///{out / 'study.db'}", ("throughput_per_gpu",), "tpe", trials, 0,
                       Constraints(max_ttft_ms=1000.0, max_tpot_ms=50.0))
    result = run_search(SearchSettings(inputs, st, out, "simulate"), on_trial)
    return result, times


def row(name: str, hw: str, c: int, result, times) -> str:
    w = result.winner
    t = f"{statistics.median(times):.2f} / {sorted(times)[int(0.99 * (len(times) - 1))]:.2f}"
    if w is None:
        return f"| {name} | {hw} | {c} | no feasible trial | | | | | | {t} |"
    m = w.metrics
    lat = m.get("latency_ms") or {}
    p = lambda k, q: (lat.get(k) or {}).get(q, float("nan"))  # noqa: E731
    phases = m.get("phases_ms", {}).get("decode", {})
    ranked = sorted(((k, v) for k, v in phases.items() if k not in ("step", "steps")), key=lambda kv: -kv[1])
    top = ", ".join(f"{k} {v:.1f}" for k, v in ranked[:3])
    return (f"| {name} | {hw} | {c} | {w.deployment.label()} | {m['output_tok_s_per_gpu']:,.0f} | "
            f"{p('ttft', 'p50'):.0f} / {p('ttft', 'p99'):.0f} | {p('tpot', 'p50'):.1f} / {p('tpot', 'p99'):.1f} | "
            f"{m['peak_mem_gb']:.1f} | {top} | {t} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--scale-routing", default=None, help="stats (default) | blocks | loads:FILE")
    a = ap.parse_args()
    print("| model | GPUs | concurrency / replica | winner | output tok/s/GPU (est.) | TTFT P50/P99 ms | "
          "TPOT P50/P99 ms | GB/GPU | decode step: top phases ms | trial s median / P99 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, config, hw in CASES:
        for c in a.concurrency:
            with tempfile.TemporaryDirectory() as tmp:
                result, times = run_case(a.trace, config, hw, c, a.trials, Path(tmp) / "out", a.scale_routing)
                print(row(name, hw, c, result, times), flush=True)


if __name__ == "__main__":
    main()
