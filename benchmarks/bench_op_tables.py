"""What the measured op tables cost a simulated trial (cost/op_tables.py): the same deployments priced
with the tables bound and with the roofline, interleaved, on one warm simulator per source (curves
sampled on the first trial of a shape, cached after). Qwen3-30B-A3B on 8×H200, closed loop 256 per
replica, input 1,024 / output 256; run with the gpu-db extra installed.

  python benchmarks/bench_op_tables.py --trace RUN [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from moetune.search.cost.deployment import Deployment
    from moetune.search.study.setup import Inputs, prepare

    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    inp = Inputs(a.trace, "8xH200", scale_model=str(ROOT / "recipes/scale/qwen3-30b-a3b.json"), input_len=1024,
                 output_len=256, concurrency=256)
    measured, roof = prepare(inp), prepare(inp)
    roof.sim.tables = None
    print(f"tables: {measured.sim.tables.note}")
    ds = [Deployment(ep_size=8, max_num_seqs=256, max_num_batched_tokens=2048, cuda_graph_max_bs=256),
          Deployment(ep_size=8, placement="eplb", redundant_experts=16, max_num_seqs=256, max_num_batched_tokens=4096,
                     quant_low_format="fp8", cuda_graph_max_bs=256),
          Deployment(ep_size=1, tp_size=8, expert_tp_size=8, max_num_seqs=256, max_num_batched_tokens=8192,
                     cuda_graph_max_bs=256)]
    first = time.perf_counter()
    for d in ds:  # warm: schedules compiled, curves sampled
        measured.sim.evaluate(d), roof.sim.evaluate(d)
    print(f"first pass (schedules, curves): {time.perf_counter() - first:.1f} s")
    times = {"tables": [], "roofline": []}
    for _ in range(a.repeats):
        for d in ds:
            for name, s in (("tables", measured), ("roofline", roof)):
                t = time.perf_counter()
                s.sim.evaluate(d)
                times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        print(f"{name}: median {statistics.median(ts) * 1e3:.0f} ms, max {max(ts) * 1e3:.0f} ms per trial "
              f"({len(ts)} trials)")


if __name__ == "__main__":
    main()
