"""What a simulated search costs (issue 38: 80 trials under a minute on two cores, each at most 0.5 s):
the README's cluster command for one case, run through the real console script, timed.

  python benchmarks/bench_sim_speed.py --trace RUN --case deepseek-v3-8 [--python PY] [--no-engine]

Prints one table row: the command's wall, the study's wall (first trial's start to the last trial's end,
from OUT/study.db), the median and P99 of the per-trial times (Optuna's start → complete: sampling,
repair, memory check and the simulated load search), the winner, /proc/loadavg before and after. With
the gpu-db extra installed in PY's environment the trials are priced on the measured tables
(`--engine vllm`); without it (or with `--no-engine` and no extra) by the roofline. Run it under an
exclusive lock on a shared machine; every figure the search prints is an estimate.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"mixtral-8x7b": ("8xH200", "mixtral-8x7b.json"), "qwen3-30b-a3b": ("8xH200", "qwen3-30b-a3b.json"),
         "deepseek-v3-8": ("8xH200", "deepseek-v3.json"), "deepseek-v3-16": ("16xH200", "deepseek-v3.json")}


def trial_times(db: Path) -> tuple[float, list[float]]:
    """(study wall s, per-trial s) of a finished study."""
    rows = sqlite3.connect(str(db)).execute(
        "select datetime_start, datetime_complete from trials where datetime_complete is not null "
        "order by number").fetchall()  # every trial that finished: priced, pruned or a twin
    t = [(dt.datetime.fromisoformat(a), dt.datetime.fromisoformat(b)) for a, b in rows]
    return (t[-1][1] - t[0][0]).total_seconds(), [(b - a).total_seconds() for a, b in t]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose environment runs moetune")
    ap.add_argument("--no-engine", action="store_true", help="leave out --engine vllm")
    ap.add_argument("--trials", type=int, default=80)
    a = ap.parse_args()
    hw, scale = CASES[a.case]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [a.python, "-m", "moetune", "search", "--trace", a.trace, "--hardware", hw, "--scale-model",
               str(ROOT / "recipes/scale" / scale), "--input-len", "1024", "--output-len", "256", "--max-ttft-ms",
               "1000", "--max-tpot-ms", "50", "--n-trials", str(a.trials), "--out", str(out)]
        cmd += [] if a.no_engine else ["--engine", "vllm"]
        load0 = Path("/proc/loadavg").read_text().split()[:3]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)  # this checkout's moetune
        wall = time.perf_counter() - t0
        load1 = Path("/proc/loadavg").read_text().split()[:3]
        if done.returncode:
            sys.exit(f"search failed: {done.stderr.strip().splitlines()[-1:]}")
        study, per = trial_times(out / "study.db")
        s = sorted(per)
        p99 = s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]
        source = next((line for line in done.stdout.splitlines() if "op costs" in line or "priced on" in line), "")
        winner = (out / "trials.csv").read_text().splitlines()
        print(f"| {a.case} | {'tables' if not a.no_engine else 'no --engine'} | {wall:.1f} | {study:.1f} | "
              f"{len(per)} | {statistics.median(s):.3f} | {p99:.3f} | {s[-1]:.3f} | {' '.join(load0)} → "
              f"{' '.join(load1)} |")
        slow = sorted(range(len(per)), key=per.__getitem__)[-3:][::-1]
        print(f"  trials.csv rows: {len(winner) - 1}; slowest trials (number: s): "
              f"{', '.join(f'{i}: {per[i]:.2f}' for i in slow)}; {source[:120]}")


if __name__ == "__main__":
    main()
