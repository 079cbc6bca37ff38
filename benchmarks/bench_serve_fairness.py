"""A short request beside a fan-out: its time to first token alone and while one request with n=N runs.

  python benchmarks/bench_serve_fairness.py [--max-num-seqs 64] [--n 64] [--fan-tokens 48] [--shares 1.0,0.5] [--repeats 2]

For each serve.max_request_share in --shares (1.0: a request may take every running slot, as before
the slot gate; 0.5: the default), interleaved --repeats times, starts `moetune serve` on the bundled
model in this process (127.0.0.1, a free port) and measures: the median TTFT of an 8-token greedy
streamed request sent alone (3 runs), then its TTFT and end while a request with n=N (N × fan-tokens
tokens, sampled) runs, and how long the fan-out took. Prints one row per run; the ratio TTFT under
the fan-out / solo is the figure to compare (same machine, same run). Record /proc/loadavg beside it.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time


def start(max_num_seqs: int, share: float):
    from moetune.config import parse_config
    from moetune.serve.server import bind, build_server, uvicorn_config
    from moetune.serve.shutdown import DrainingServer

    cfg = parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}, "engine": {"max_num_seqs": max_num_seqs},
                        "serve": {"max_queue": 2 * max_num_seqs, "max_request_share": share}})
    sock = bind("127.0.0.1", 0)
    built = build_server(cfg)
    server = DrainingServer(uvicorn_config(built.app, "warning", cfg.serve), built.state, 5.0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", built.state, server, thread


def short_ttft(url: str) -> tuple[float, float]:
    """(seconds to the first streamed token, seconds to the end) of an 8-token greedy request."""
    import httpx

    began, first = time.monotonic(), None
    body = {"prompt": "def add(a, b):\n", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"text"' in line:
                first = time.monotonic() - began
    return first, time.monotonic() - began


def one_run(args, share: float) -> dict:
    import httpx

    url, state, server, thread = start(args.max_num_seqs, share)
    try:
        solo = statistics.median(short_ttft(url)[0] for _ in range(3))
        fan: dict = {}

        def fan_out():
            began = time.monotonic()
            fan["r"] = httpx.post(f"{url}/v1/completions", timeout=600, json={
                "prompt": "class Tree:\n", "n": args.n, "max_tokens": args.fan_tokens, "temperature": 1.0,
                "seed": 1, "ignore_eos": True})
            fan["end"], fan["took"] = time.monotonic(), time.monotonic() - began

        worker = threading.Thread(target=fan_out)
        worker.start()
        held = min(args.n, max(1, int(share * args.max_num_seqs)))
        while state.worker.snapshot.running < held and worker.is_alive():
            time.sleep(0.005)
        ttft, took = short_ttft(url)
        short_end = time.monotonic()
        worker.join()
        assert fan["r"].status_code == 200, fan["r"].text
        return {"share": share, "solo_ms": solo * 1e3, "ttft_ms": ttft * 1e3, "short_s": took,
                "fan_s": fan["took"], "short_first": short_end < fan["end"]}
    finally:
        server.should_exit = True
        thread.join(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--fan-tokens", type=int, default=48)
    ap.add_argument("--shares", default="1.0,0.5")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    print(f"max_num_seqs {args.max_num_seqs}, fan-out n={args.n} × {args.fan_tokens} tokens; "
          f"loadavg {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'share':>6} {'solo TTFT ms':>13} {'TTFT beside ms':>15} {'ratio':>6} {'short s':>8} {'fan-out s':>10} "
          f"{'short first':>11}")
    for _ in range(args.repeats):
        for share in shares:
            r = one_run(args, share)
            print(f"{r['share']:>6.2f} {r['solo_ms']:>13.0f} {r['ttft_ms']:>15.0f} {r['ttft_ms'] / r['solo_ms']:>6.1f} "
                  f"{r['short_s']:>8.2f} {r['fan_s']:>10.2f} {str(r['short_first']):>11}", flush=True)
    print(f"loadavg after {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
