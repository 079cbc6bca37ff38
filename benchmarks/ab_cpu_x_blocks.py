"""A/B of the integer CPU linears across two source trees, processes taking turns (issue 30).

  flock /work/logs/cpu.lock python benchmarks/ab_cpu_x_blocks.py --base /tmp/base [/tmp/other ...] [--rounds 2]

Each `--base` holds another checkout's `moetune` (e.g. `git archive <commit> moetune | tar -x -C DIR`:
the per-row rounding of x, or this tree with another `_simd.XB`); this tree is the last side. Each
round runs one child process per side, in turn, each with its own numba cache; a child times, per weight shape [N, K] and x rows
M, `linear` on int8 (`Q8_ROWS` 16) and int4-g64 (`Q4_ROWS` 16) weights over `--mb` MB of distinct
int8 weights (int4: as many matrices) and the read-limit stream (`W.sum()`) in turn, `--repeat`
times. Printed: per side and case the median ms over rounds (min..max) and the share of the read
limit of the same child, and each side's median time ÷ the first side's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = ((4096, 768), (32000, 768), (768, 2048))

CHILD = r"""
import json, statistics, sys, time
import torch
from moetune.kernels.cpu import linear, quantize_int4, quantize_int8, runtime, set_threads
from moetune.kernels.cpu.formats import weight_bytes
shapes, rows, repeat, mb, threads = json.loads(sys.argv[1])
set_threads(threads); torch.set_num_threads(threads)
runtime.Q8_ROWS = runtime.Q4_ROWS = 16
out = {}
for N, K in shapes:
    g = torch.Generator().manual_seed(N + K)
    copies = max(2, int(mb * 1e6 // (N * K)))
    w8 = [quantize_int8(torch.randn(N, K, generator=g)) for _ in range(copies)]
    w4 = [quantize_int4(torch.randn(N, K, generator=g), 64) for _ in range(2 * copies)]
    stream = [torch.randn(N, K, generator=g) for _ in range(max(1, copies // 4))]
    for M in rows:
        x = torch.randn(M, K, generator=g)
        cases = {"limit": (sum(t.nbytes for t in stream), lambda: [t.sum() for t in stream]),
                 "int8": (sum(weight_bytes(w) for w in w8), lambda: [linear(x, w) for w in w8]),
                 "int4": (sum(weight_bytes(w) for w in w4), lambda: [linear(x, w) for w in w4])}
        times = {k: [] for k in cases}
        for _, fn in cases.values():
            fn(); fn()
        for _ in range(repeat):
            for k, (_, fn) in cases.items():
                t0 = time.perf_counter(); fn(); times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        limit = cases["limit"][0] / med["limit"]
        out[f"{N}x{K} M={M}"] = {k: [med[k] * 1e3, cases[k][0] / med[k] / limit] for k in ("int8", "int4")}
print(json.dumps(out))
"""


def child(tree: Path, cache: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(cache))
    spec = json.dumps([SHAPES, args.rows, args.repeat, args.mb, args.threads])
    done = subprocess.run([sys.executable, "-c", CHILD, spec], env=env, check=True, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, nargs="+", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mb", type=float, default=48.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    sides = {**{f"{i}:{p.name}": p.resolve() for i, p in enumerate(args.base)}, "new": here}
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds + 1):  # round 0 compiles into each side's cache, not counted
            for side, tree in sides.items():
                got = child(tree, Path(tmp) / side, args)
                if r:
                    runs[side].append(got)
    first = next(iter(sides))
    for key in runs["new"][0]:
        for case in ("int8", "int4"):
            base = statistics.median(run[key][case][0] for run in runs[first])
            cells = []
            for side in sides:
                ms = [run[key][case][0] for run in runs[side]]
                share = [run[key][case][1] for run in runs[side]]
                cells.append(f"{side} {statistics.median(ms):6.2f} ({min(ms):.2f}..{max(ms):.2f}) "
                             f"{100 * statistics.median(share):3.0f}% x{statistics.median(ms) / base:.2f}")
            print(f"{key:<16} {case}  " + " | ".join(cells))

if __name__ == "__main__":
    main()
