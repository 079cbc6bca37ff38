"""Where `moetune serve`'s time goes under a bench-serve load, and an interleaved A/B of serve flag sets
(e.g. the stream interval: serve/stream_interval.py).

  python benchmarks/ab_stream_interval.py [--concurrency 1,32,64] [--reps 2] [--lock /work/cpu.lock]
      [--arm 'si1=--stream-interval 1' --arm 'auto='] [--output-len 64]

Each rep starts `moetune serve` (stdlib-moe, max_num_seqs 64, as benchmarks/bench_serve_vs_vllm.py does)
once per arm, in turn (arms alternate order between reps), and sends it the same load as that script
at each C: max(8, 2·C) of the bundled prompts, `output_len` tokens each, C in flight, after two
untimed warm-ups. Per arm and C: out tok/s, TTFT / TPOT P50 from bench-serve; per server thread
(told apart by id: the main thread steps the engine, the next is its OpenMP worker, the last
uvicorn) the CPU seconds per second it ran and the seconds per second it waited runnable for a core
(/proc/<pid>/task/<tid>/schedstat); the client's own CPU per second; and the engine's decode step
(median, ms) at full batch, timed inside the server (this script runs serve through a wrapper that
times Engine.step and writes the times at exit). With --lock the whole run is under one exclusive
hold (keep it under ~5 minutes: a few arms, one or two reps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_vs_vllm import held, load, start  # noqa: E402  (this directory's script)

WRAPPER = '''import atexit, json, os, sys, time
from moetune.engine import engine as E
times, plain = [], E.Engine.step
def step(self):
    full = len(self.scheduler.running) if not self.scheduler.waiting else -1
    t = time.perf_counter(); out = plain(self); times.append((full, time.perf_counter() - t)); return out
E.Engine.step = step
atexit.register(lambda: json.dump(times, open(os.environ["STEP_TIMES"], "w")))
sys.argv = ["moetune"] + sys.argv[1:]
from moetune.cli.main import main
main()
'''


def task_clocks(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread of `pid`: (seconds run, seconds waited runnable) since it started."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run, wait, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (int(run) / 1e9, int(wait) / 1e9)
    return out


def server_pid(guard_pid: int) -> int:
    """The serve process in the guard's process group (the wrapper's python)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != guard_pid:
            try:
                if os.getpgid(int(d.name)) == guard_pid and b"serve_timed.py" in (d / "cmdline").read_bytes():
                    return int(d.name)
            except OSError:
                continue
    raise SystemExit("the serve process was not found")


def one_arm(flags: list[str], concurrency: list[int], output_len: int, work: Path) -> dict:
    wrapper = work / "serve_timed.py"
    wrapper.write_text(WRAPPER)
    steps = work / "steps.json"
    argv = [sys.executable, str(wrapper), "serve", "--model", "stdlib-moe", "--host", "127.0.0.1", "--port", "PORT",
            "--max-num-seqs", "64", "--max-queue", "256", *flags]
    server = start(argv, work / "serve.log", {"STEP_TIMES": str(steps), "OMP_NUM_THREADS": str(os.cpu_count())})
    rows = {}
    try:
        pid = server_pid(server.proc.pid)
        for c in concurrency:
            before, cpu0, t0 = task_clocks(pid), os.times(), time.perf_counter()
            r = load(server.url, c, output_len)
            dt, cpu1, after = time.perf_counter() - t0, os.times(), task_clocks(pid)
            threads = {tid: [round((after[tid][i] - before.get(tid, (0, 0))[i]) / dt, 2) for i in (0, 1)]
                       for tid in sorted(after)}
            r["threads_run_wait"] = {t: v for t, v in threads.items() if v[0] >= 0.01}
            r["client_cpu"] = round((cpu1.user - cpu0.user + cpu1.system - cpu0.system) / dt, 2)
            r["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
            rows[c] = r
    finally:
        server.stop()
    times = json.loads(steps.read_text()) if steps.exists() else []
    for c in concurrency:
        full = [d for n, d in times if n == c]
        rows[c]["decode_step_ms"] = round(statistics.median(full) * 1e3, 2) if full else None
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,32,64")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--arm", action="append", help="NAME=FLAGS (serve flags, space-separated; may be empty)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--lock", default=None)
    args = p.parse_args()
    arms = dict(a.split("=", 1) for a in (args.arm or ["si1=--stream-interval 1", "auto="]))
    concurrency = [int(x) for x in args.concurrency.split(",")]
    with held(args.lock, exclusive=True), tempfile.TemporaryDirectory() as tmp:
        print("load before:", Path("/proc/loadavg").read_text().strip(), flush=True)
        for rep in range(args.reps):
            for name in (list(arms) if rep % 2 == 0 else list(arms)[::-1]):
                rows = one_arm(arms[name].split(), concurrency, args.output_len, Path(tmp))
                for c, r in rows.items():
                    print(f"rep {rep} {name} C={c}: {r['out_tok_s']:.0f} out tok/s, TTFT P50 "
                          f"{r['ttft_p50']:.1f} ms, TPOT P50 {r['tpot_p50']:.2f} ms, decode step "
                          f"{r['decode_step_ms']} ms, server threads [run, wait] /s {r['threads_run_wait']}, "
                          f"client {r['client_cpu']} (load {' '.join(r['loadavg'])})", flush=True)


if __name__ == "__main__":
    main()
