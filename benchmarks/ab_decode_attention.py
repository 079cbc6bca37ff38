"""In-process A/B of the paged decode-attention kernel (`_jit_attention`): this checkout's against
the one at a git revision (default main), on the same arrays, in rounds that take the sides in turn.

  python benchmarks/ab_decode_attention.py [--rev main] [--lens 129] [--heads 12 4 64] [--block 16]
         [--layers 8] [--rounds 7] [--calls 400]

A call's arrays: q [B, H, Dh], a K and a V pool [rows, Hkv, Dh] whose blocks are handed out in a random
order (as a running cache does), tables [B, nb], lens [B]. `--layers` pools are visited in turn (8 layers'
K and V of the 364M bench model at 129 positions: 2.1 MB, past L2), and each side runs serial and
parallel (the two drivers of `_jit_layer._attend`). Prints per side and driver the median µs per call
with its min-max over rounds, the in-run ratio old ÷ new per round (median, min, max), and the load
average before and after. Run it under `flock -x /work/cpu.lock` (it times).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "moetune/kernels/cpu/_jit_attention.py"


def load_kernel(source: str, name: str, folder: str):
    """The kernel module compiled from `source` (its own file, so numba caches it apart)."""
    path = Path(folder) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arrays(lens: list[int], H: int, Hkv: int, Dh: int, block: int, layers: int, seed: int = 0):
    """q, [(k_pool, v_pool)] per layer, tables, lens, scores scratch, out."""
    rng = np.random.default_rng(seed)
    B = len(lens)
    nb = max(-(-n // block) for n in lens)
    rows = (B * nb + 1) * block
    tables = (rng.permutation(B * nb) + 1).reshape(B, nb).astype(np.int64)
    pools = [(rng.standard_normal((rows, Hkv, Dh), np.float32), rng.standard_normal((rows, Hkv, Dh), np.float32))
             for _ in range(layers)]
    q = rng.standard_normal((B, H, Dh), np.float32)
    scores = np.empty((B * Hkv, H // Hkv, max(lens)), np.float32)
    return q, pools, tables, np.array(lens, np.int64), scores, np.empty_like(q)


def time_side(fn, q, pools, tables, lens, block, scale, window, scores, out, calls: int) -> float:
    """µs per call, the pools taken in turn."""
    t0 = time.perf_counter()
    for c in range(calls):
        kp, vp = pools[c % len(pools)]
        fn(q, kp, vp, tables, lens, block, scale, window, scores, out)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="main")
    ap.add_argument("--lens", type=int, nargs="+", default=[129])
    ap.add_argument("--heads", type=int, nargs=3, default=[12, 4, 64], metavar=("H", "HKV", "DH"))
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import numba

    numba.set_num_threads(args.threads)
    old_src = subprocess.run(["git", "show", f"{args.rev}:{KERNEL}"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout
    folder = tempfile.mkdtemp(prefix="ab_attn_")
    sides = {"old": load_kernel(old_src, "attn_old", folder),
             "new": load_kernel((ROOT / KERNEL).read_text(), "attn_new", folder)}
    H, Hkv, Dh = args.heads
    q, pools, tables, lens, scores, out = arrays(args.lens, H, Hkv, Dh, args.block, args.layers)
    scale = float(Dh**-0.5)
    results = {}
    for side, mod in sides.items():  # compile, and check the two sides agree
        for driver in ("decode_attention_serial", "decode_attention"):
            getattr(mod, driver)(q, *pools[0], tables, lens, args.block, scale, args.window, scores, out)
            results[side, driver] = out.copy()
    err = max(float(np.abs(results["old", d] - results["new", d]).max()) for d in ("decode_attention",
                                                                                 "decode_attention_serial"))
    load_before = os.getloadavg()
    times = {(s, d): [] for s in sides for d in ("decode_attention_serial", "decode_attention")}
    for r in range(args.rounds):
        order = list(times) if r % 2 == 0 else list(reversed(list(times)))
        for side, driver in order:
            fn = getattr(sides[side], driver)
            times[side, driver].append(time_side(fn, q, pools, tables, lens, args.block, scale, args.window,
                                                 scores, out, args.calls))
    print(f"lens {args.lens} H/Hkv/Dh {args.heads} block {args.block} window {args.window} layers {args.layers} "
          f"threads {args.threads}; max |old - new| {err:.2e}; load {load_before} -> {os.getloadavg()}")
    for driver in ("decode_attention_serial", "decode_attention"):
        o, n = times["old", driver], times["new", driver]
        ratio = [a / b for a, b in zip(o, n)]
        print(f"  {driver:24s} old {statistics.median(o):7.2f} us [{min(o):.2f}-{max(o):.2f}]  "
              f"new {statistics.median(n):7.2f} us [{min(n):.2f}-{max(n):.2f}]  old/new median "
              f"{statistics.median(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}]")


if __name__ == "__main__":
    main()
