"""Rank imbalance (max / mean expert copies per rank) of the scaled routing under each placement:
for each recipes/scale config, `--scale-routing blocks` vs `stats` (search/cost/scale.py), on R ranks.

  python benchmarks/bench_scale_routing.py --trace RUN [--ranks 8] [--hardware 8xH200] [--concurrency 256]

Two figures per cell: `trace` — the whole trace's loads at once (scale.rank_imbalance: what EPLB is
placed from); `sim` — the simulator's `rank_imbalance` (rows per rank summed over the steps of a
closed-loop run at --concurrency, input 1,024 / output 256 tokens: what the straggler wait is priced
from). Each source layer's load CV and each routing's target CV (mean over layers) beside them.
Every figure is an estimate from the trace's routing, not a measurement of the large model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("Mixtral-8x7B", "mixtral-8x7b.json"), ("Qwen3-30B-A3B", "qwen3-30b-a3b.json"),
           ("DeepSeek-V3", "deepseek-v3.json")]
PLACEMENTS = ("contiguous", "round_robin", "eplb")


def cell(trace: str, config: str, routing: str, a) -> str:
    from moetune.search.cost.scale import load_cv, rank_imbalance
    from moetune.search.study.setup import Inputs, prepare
    from moetune.search.study.space import Deployment

    setup = prepare(Inputs(trace, a.hardware, scale_model=str(ROOT / "recipes/scale" / config), input_len=1024,
                           output_len=256, num_requests=4 * a.concurrency, concurrency=a.concurrency,
                           scale_routing=routing))
    loads = setup.source.loads  # [Lm, E]
    whole = [rank_imbalance(loads, a.ranks, p) for p in PLACEMENTS]
    sim = [setup.sim.evaluate(Deployment(ep_size=a.ranks, max_num_seqs=a.concurrency, placement=p))
           .detail["rank_imbalance"] for p in PLACEMENTS]
    pair = " | ".join(f"{w:.2f} / {s:.2f}" for w, s in zip(whole, sim))
    return f"{routing} | {float(np.mean(load_cv(loads))):.2f} | {pair}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--hardware", default="8xH200")
    ap.add_argument("--concurrency", type=int, default=256)
    a = ap.parse_args()
    from moetune.profile.rundir import read_run
    from moetune.search.cost.scale import load_cv

    ids = read_run(Path(a.trace)).trace.topk_ids
    E = int(ids.max()) + 1
    src = np.stack([np.bincount(ids[:, j].astype(np.int64).ravel(), minlength=E) for j in range(ids.shape[1])])
    print(f"source: {ids.shape[1]} MoE layers × {E} experts, load CV per layer {np.round(load_cv(src), 2).tolist()}")
    print("| model | routing | target CV (mean of layers) | contiguous trace / sim | round_robin trace / sim | "
          "eplb trace / sim |")
    print("|---|---|---|---|---|---|")
    for name, config in CONFIGS:
        for routing in ("blocks", "stats"):
            print(f"| {name} | {cell(a.trace, config, routing, a)} |", flush=True)


if __name__ == "__main__":
    main()
