"""How close a one-row GEMV comes to the read limit at the same moment (CPU).

`moetune bench` sets decode against the read limit: a `sum()` over 512 MiB of fp32 in huge pages.
This script alternates that probe with one-row GEMVs over weights that no cache holds (fp32
LM-head-shaped [32000, 768], int8 expert-shaped [4096, 768]; huge pages like the model's) through
moetune's decode kernel, and with torch's `F.linear` on the fp32 ones, and prints each round's rates
and the median ratio to the probe of the same round: the ceiling a decode step could reach if
nothing but its weight reads took time.

    python benchmarks/bench_cpu_stream.py --rounds 12
"""

from __future__ import annotations

import argparse
import statistics
import time

from moetune.engine.threads import choose_wait_policy, use_threads

choose_wait_policy()  # as the CLI does, before torch loads OpenMP (docs/cpu.md)

import numpy as np  # noqa: E402
import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    use_threads(args.threads)

    from moetune.bench.roofline import LimitSampler
    from moetune.kernels.cpu.runtime import jit
    from moetune.model.hugepages import huge_empty

    limit = LimitSampler(torch.device("cpu"))
    fp32 = [huge_empty((32000, 768), torch.float32).normal_() for _ in range(4)]  # 393 MB
    int8 = [huge_empty((4096, 768), torch.int8).random_(-127, 127) for _ in range(64)]  # 201 MB
    k, x = jit(), torch.randn(1, 768)

    def gemv(weights: list[torch.Tensor]) -> float:
        arrays = [w.numpy() for w in weights]
        y, ones = np.empty((1, arrays[0].shape[0]), np.float32), np.ones(arrays[0].shape[0], np.float32)
        start = time.perf_counter()
        for w in arrays:
            k.linear_dense(x.numpy(), w, ones, y, 8)
        return sum(w.nbytes for w in arrays) / (time.perf_counter() - start) / 1e9

    def torch_linear() -> float:
        start = time.perf_counter()
        for w in fp32:
            torch.nn.functional.linear(x, w)
        return sum(w.nbytes for w in fp32) / (time.perf_counter() - start) / 1e9

    gemv(fp32), gemv(int8), torch_linear(), limit.sample("read")  # warm-up (compiles the kernel)
    ratios: dict[str, list[float]] = {"kernel fp32": [], "kernel int8": [], "torch F.linear fp32": []}
    print(f"threads {torch.get_num_threads()}")
    for r in range(args.rounds):
        read = limit.sample("read")
        rates = {"kernel fp32": gemv(fp32), "kernel int8": gemv(int8), "torch F.linear fp32": torch_linear()}
        for name, rate in rates.items():
            ratios[name].append(rate / read)
        print(f"round {r}: read limit {read:5.1f} GB/s · " +
              " · ".join(f"{name} {rate:5.1f} ({rate / read:.0%})" for name, rate in rates.items()), flush=True)
    for name, got in ratios.items():
        print(f"{name}: median {statistics.median(got):.0%} of the read limit of the same round "
              f"(min {min(got):.0%}, max {max(got):.0%})")


if __name__ == "__main__":
    main()
