"""Fidelity of the simulator's speculation pricing on this machine: profile with --speculative ngram:4
at batch B, price plain and ngram:4 from that trace (this-machine, microbenchmark calibration), and
measure both with benchmarks/bench_speculative.py (interleaved rounds). Run under the CPU lock:

  flock /work/logs/cpu.lock python benchmarks/fidelity_speculative.py   # FIDELITY_OUT=DIR (default /tmp/specsim)

Each line carries the load average; docs/search-numbers.md has the table of 2026-12-02."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("FIDELITY_OUT", "/tmp/specsim"))
MODELS = {"stdlib": "stdlib-moe", "m340": "/work/runs/m340"}
BATCHES = [1, 16]


def load() -> str:
    return open("/proc/loadavg").read().strip()


def recipe(name, path, spec):
    p = OUT / f"{name}-{spec or 'plain'}.yaml"
    p.write_text(f"model:\n  path: {path}\n  device: cpu\n" + (f"engine:\n  speculative: {spec}\n" if spec else ""))
    return str(p)


def main() -> None:
    from moetune.search.study.one import simulate_recipe
    from moetune.search.study.setup import Inputs

    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, path in MODELS.items():
        for B in BATCHES:
            run = OUT / f"prof-{name}-b{B}"
            if not (run / "summary.json").exists():
                t = time.time()
                subprocess.run(["moetune", "profile", "--model", path, "--speculative", "ngram:4", "--batch-size", str(B),
                                "--num-requests", str(B), "--input-len", "96", "--output-len", "33", "--out", str(run)],
                               check=True, capture_output=True)
                print(f"profiled {name} b{B} in {time.time() - t:.0f}s, load {load()}", flush=True)
            spec = json.loads((run / "summary.json").read_text())["speculative"]
            est = {}
            for s in (None, "ngram:4"):
                _, d, m = simulate_recipe(Inputs(str(run), "this-machine", recipe=recipe(name, path, s)))
                est[s or "plain"] = m.decode_tok_s
                if s:
                    est["detail"] = m.detail.get("speculative")
            print(f"estimate {name} b{B}: plain {est['plain']:.1f} spec {est['ngram:4']:.1f} tok/s; "
                  f"{est['detail']}; load {load()}", flush=True)
            res = subprocess.run([sys.executable, "benchmarks/bench_speculative.py", "--model", path, "--batch", str(B),
                                  "--rounds", "3", "--prompt-len", "96", "--output-len", "33"],
                                 check=True, capture_output=True, text=True).stdout
            print(res, flush=True)
            rows.append({"model": name, "batch": B, "profile_spec": spec, "estimate": est, "bench": res})
    (OUT / "fidelity.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
