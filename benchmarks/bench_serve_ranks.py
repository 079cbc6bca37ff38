"""`moetune bench-serve` against `moetune serve` at R = 1 and R = 2 ranks, levels interleaved.

Both servers (the bundled model, `--max-num-seqs S --max-queue Q`) run at once; for each round and
each load level the R = 1 and R = 2 servers are loaded in turn (so a change in the machine's load
hits both alike), with the machine's 1-minute load average read before each run. Levels:
concurrency 1, 8, 32 and 4× saturation (four times the sequences the server holds running or
queued: R·S + Q), each with enough prompts to fill it several times over. Prints one row per
(level, R, round): output tok/s, TTFT / TPOT P50 and P99, answered / refused / lost, load.

    python benchmarks/bench_serve_ranks.py --rounds 1 --output-len 64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def start(ranks: int, seqs: int, queue: int) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if ranks > 1 else dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "moetune", "serve", "--port", "0", "--device", "cpu",
                             "--ep-size", str(ranks), "--max-num-seqs", str(seqs), "--max-queue", str(queue)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url, ready = [], threading.Event()

    def read():
        for line in proc.stderr:
            found = re.search(r"http://[0-9.]+:\d+", line)
            if found:
                url.append(found.group(0))
            if "startup complete" in line:
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(300) or not url:
        proc.kill()
        raise SystemExit(f"the R={ranks} server did not start")
    return proc, url[0]


def bench(url: str, concurrency: int, prompts: int, output_len: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "moetune", "bench-serve", "--url", url, "--num-prompts", str(prompts),
                    "--concurrency", str(concurrency), "--output-len", str(output_len), "--out", str(out)],
                   check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=16)
    args = parser.parse_args()
    servers = {r: start(r, args.max_num_seqs, args.max_queue) for r in (1, 2)}
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-ranks-"))
    print(f"{'level':>14} {'R':>2} {'tok/s':>7} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17} "
          f"{'ans/ref/lost':>13} {'load':>5}")
    try:
        for rnd in range(args.rounds):
            for name, conc in [("c=1", 1), ("c=8", 8), ("c=32", 32), ("4x saturation", None)]:
                for r, (_, url) in servers.items():
                    c = conc or 4 * (r * args.max_num_seqs + args.max_queue)
                    prompts = max(4 * c, 16) if conc else c
                    load = Path("/proc/loadavg").read_text().split()[0]
                    res = bench(url, c, prompts, args.output_len, tmp / f"{name}-{r}-{rnd}.json")
                    t, p = res["ttft_ms"], res["tpot_ms"]
                    print(f"{name + f' ({c})':>14} {r:>2} {res['output_token_throughput']:7.1f} "
                          f"{t['p50']:8.0f}/{t['p99']:<8.0f} {p['p50']:8.1f}/{p['p99']:<8.1f} "
                          f"{res['answered']:>5}/{res['refused']}/{res['lost']:<5} {load:>5}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
