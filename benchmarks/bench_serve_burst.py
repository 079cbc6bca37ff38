"""A burst at 4× saturation, 10 % malformed and 10 % disconnecting early: nothing well-formed is lost.

  python benchmarks/bench_serve_burst.py [--max-num-seqs 4] [--max-queue 12] [--factor 4] [--max-tokens 16]

Starts `moetune serve` on the bundled model in this process (127.0.0.1, a free port), then fires
factor × (max_num_seqs + max_queue) requests at once: 10 % malformed bodies (a lone surrogate, 40
levels of nesting, a 50-digit integer, a 2^64 seed, not JSON), 10 % clients that go away after
0.05–1 s (half of them streaming), the rest well-formed (greedy, `max_tokens` tokens, `ignore_eos`).
Counts, for the well-formed: answered (200 with every token), refused (429/503 with an error
object) and lost (anything else: a 5xx, a reset, a timeout, a short answer); for the malformed: 400
or not; and afterwards the server's in-flight sequences and KV blocks (both must be back to 0).
Bounded: at most 2,000 requests, a 120 s timeout per request, 10 minutes in all.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import threading
import time
from collections import Counter

MALFORMED = [b'{"prompt": "a\\ud800b", "max_tokens": 4}', b'{"prompt": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}",
             b'{"prompt": "x", "max_tokens": 1' + b"0" * 50 + b"}",
             b'{"prompt": "x", "seed": 18446744073709551616, "temperature": 1}', b"{not json"]


def start(max_num_seqs: int, max_queue: int):
    from moetune.config import parse_config
    from moetune.serve.server import bind, build_server, uvicorn_config
    from moetune.serve.shutdown import DrainingServer

    cfg = parse_config({"model": {"path": "stdlib-moe", "device": "cpu"},
                        "engine": {"max_num_seqs": max_num_seqs}, "serve": {"max_queue": max_queue}})
    sock = bind("127.0.0.1", 0)
    built = build_server(cfg)
    server = DrainingServer(uvicorn_config(built.app, "warning"), built.state, 5.0)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", built.state, server


async def well_formed(client, url: str, max_tokens: int) -> str:
    body = {"prompt": "def parse(text):\n", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    try:
        r = await client.post(f"{url}/v1/completions", json=body)
    except Exception as exc:  # noqa: BLE001 - any transport failure is a lost request
        return f"lost:{type(exc).__name__}"
    if r.status_code == 200 and r.json()["usage"]["completion_tokens"] == max_tokens:
        return "answered"
    if r.status_code in (429, 503) and "error" in r.json():
        return "refused"
    return f"lost:{r.status_code}"


async def malformed(client, url: str, raw: bytes) -> str:
    r = await client.post(f"{url}/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    return "400" if r.status_code == 400 else f"not-400:{r.status_code}"


async def leaving(client, url: str, stream: bool, after: float) -> str:
    body = {"prompt": "class Parser:\n", "max_tokens": 200, "ignore_eos": True, "stream": stream}

    async def go():
        if stream:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    pass
        else:
            await client.post(f"{url}/v1/completions", json=body)

    try:
        await asyncio.wait_for(go(), after)
        return "finished-before-leaving"
    except asyncio.TimeoutError:
        return "left"


async def burst(url: str, n: int, max_tokens: int, seed: int) -> Counter:
    import httpx

    rng = random.Random(seed)
    kinds = ["malformed"] * (n // 10) + ["leaving"] * (n // 10)
    kinds += ["well"] * (n - len(kinds))
    rng.shuffle(kinds)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tasks = []
        for kind in kinds:
            if kind == "well":
                tasks.append(well_formed(client, url, max_tokens))
            elif kind == "malformed":
                tasks.append(malformed(client, url, rng.choice(MALFORMED)))
            else:
                tasks.append(leaving(client, url, rng.random() < 0.5, rng.uniform(0.05, 1.0)))
        results = await asyncio.gather(*tasks)
    return Counter(f"{k}:{r}" for k, r in zip(kinds, results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--max-queue", type=int, default=12)
    p.add_argument("--factor", type=int, default=4, help="requests = factor × (max_num_seqs + max_queue)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    url, state, server = start(args.max_num_seqs, args.max_queue)
    n = min(args.factor * state.capacity, 2000)
    t = time.monotonic()
    counts = asyncio.run(asyncio.wait_for(burst(url, n, args.max_tokens, args.seed), 600))
    wall = time.monotonic() - t
    deadline = time.monotonic() + 30
    while (state.inflight or state.worker.snapshot.kv_blocks_used) and time.monotonic() < deadline:
        time.sleep(0.1)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{n} requests ({args.factor}× capacity {state.capacity}) in {wall:.1f} s; load {' '.join(load)}")
    for key in sorted(counts):
        print(f"  {key:40s} {counts[key]}")
    lost = sum(v for k, v in counts.items() if k.startswith("well:lost") or k.startswith("malformed:not-400"))
    print(f"afterwards: in-flight sequences {state.inflight}, KV blocks used {state.worker.snapshot.kv_blocks_used}, "
          f"engine healthy {state.worker.healthy}; lost {lost}")
    server.should_exit = True
    raise SystemExit(1 if lost or state.inflight or state.worker.snapshot.kv_blocks_used else 0)


if __name__ == "__main__":
    main()
