"""Which thread steps the engine: one decode loop timed on the main thread, on a second thread, or on
both alternately (serve/engine_on_main.py's reason).

  GOMP_SPINCOUNT=100000 python benchmarks/ab_engine_thread.py --mode main-only|thread-only|both
      [--model stdlib-moe] [--batch 1 32] [--blocks 6]

The model is built on the thread that steps it first (main-only, both: the main thread; thread-only:
the second thread). `both` alternates the two threads block by block (main, thread, thread, main, ...),
as `moetune serve` did before its loop moved to the main thread (the main thread had launched the
kernels while loading, the engine thread stepped). Each block: `batch` requests of a 40-token prompt,
one prefill step, then 63 decode steps timed one by one; printed: the median decode step per block and
over blocks, per thread. Run it with the OpenMP wait set in the environment (as above: moetune's CLI
chooses it from the load at start, this script does not) and under an exclusive hold on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import threading
import time


class Second:
    """A persistent second thread that runs the callables handed to it, one at a time."""

    def __init__(self) -> None:
        self.todo: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="second", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.done.put(self.todo.get()())

    def __call__(self, fn):
        self.todo.put(fn)
        return self.done.get()


def block(engine, prompt: list[int], batch: int) -> float:
    """Median decode step (ms) of `batch` requests of 64 tokens."""
    from moetune.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=64, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(prompt, params)
    engine.step()  # the prefill
    times = []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["main-only", "thread-only", "both"], required=True)
    p.add_argument("--model", default="stdlib-moe")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--blocks", type=int, default=6)
    args = p.parse_args()
    from moetune.engine.threads import use_threads, wait_policy

    print(f"OpenMP wait: {wait_policy()} · load {' '.join(open('/proc/loadavg').read().split()[:3])}")
    use_threads(None)
    from moetune.config import RunConfig
    from moetune.engine.build import build_generator

    second = Second()
    on = {"main": lambda fn: fn(), "thread": second}
    first = "thread" if args.mode == "thread-only" else "main"
    gen = on[first](lambda: build_generator(RunConfig(model={"path": args.model}, engine={"max_num_seqs": 64})))
    prompt = gen.encode("def fibonacci(n):\n    ")[:40]
    on[first](lambda: block(gen.engine, prompt, 8))  # warm-up
    for batch in args.batch:
        res: dict[str, list[float]] = {"main": [], "thread": []}
        for i in range(args.blocks):
            order = [first] if args.mode != "both" else (["main", "thread"] if i % 2 == 0 else ["thread", "main"])
            for where in order:
                res[where].append(on[where](lambda: block(gen.engine, prompt, batch)))
        line = " · ".join(f"{w} {statistics.median(v):.3f} ms (blocks: {', '.join(f'{x:.2f}' for x in v)})"
                          for w, v in res.items() if v)
        print(f"{args.mode} batch {batch}: decode step {line} · OS threads {len(os.listdir('/proc/self/task'))}",
              flush=True)


if __name__ == "__main__":
    main()
