"""Benchmark the Triton MoE kernels against the torch path on real layer shapes (CUDA only).

  python benchmarks/bench_moe_kernels.py [--quick] [--batch-sizes 1 16 256 4096]

Shapes: Mixtral-8x7B (E=8, K=2, D=4096, I=14336, softmax top-2) and DeepSeek-V3 (E=256, K=8,
D=7168, I=2048, sigmoid group-limited 8 groups / top-4 groups), bf16. Each row times the routed
part of a layer after the gate GEMM (router select → align → grouped GEMMs → combine for triton;
select → permute → per-expert loop → unpermute for torch), CUDA events, warm-up, median of N.

  FLOP      = 2 · M·K · 3·D·I                  (w13: 2I×D, w2: D×I per token copy)
  bytes     = active experts · 3·D·I · 2 B + (M·D + M·K·D + M·D) · 2 B   (weights read once + x, y, out)
  TFLOP/s   = FLOP / time;  GB/s = bytes / time
  % of peak = against a measured 8192³ bf16 matmul (FLOP/s) and a 1 GiB device copy (GB/s)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shape:
    name: str
    E: int
    K: int
    D: int
    I: int
    score: str
    n_group: int = 1
    topk_group: int = 1


SHAPES = (Shape("mixtral-8x7b", 8, 2, 4096, 14336, "softmax"),
          Shape("deepseek-v3", 256, 8, 7168, 2048, "sigmoid", 8, 4))
QUICK = (Shape("mixtral-quick", 8, 2, 1024, 2048, "softmax"), Shape("deepseek-quick", 64, 8, 1024, 512, "sigmoid", 8, 4))


def median_ms(fn, warmup: int = 5, repeat: int = 20) -> float:
    from moetune.kernels.tuning import median_ms as cuda_median_ms  # CUDA events, median

    return cuda_median_ms(fn, warmup, repeat)


def measure_peaks() -> tuple[float, float]:
    """(peak FLOP/s from an 8192³ bf16 matmul, peak B/s from a 1 GiB device-to-device copy)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    flops = 2 * 8192 ** 3 / (median_ms(lambda: a @ a) * 1e-3)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bps = 2 * src.numel() / (median_ms(lambda: dst.copy_(src)) * 1e-3)  # read + write
    return flops, bps


def _paths(shape: Shape):
    """(triton fn, torch fn) closures over one layer's inputs: (x, logits) → [M, D]."""
    from moetune.experts.store import ExpertWeights
    from moetune.spec import MoESpec, RouterSpec
    from moetune.moe.backend import TorchBackend
    from moetune.moe.triton_backend import TritonBackend

    spec = MoESpec(shape.E, shape.I, RouterSpec(shape.score, shape.K, True, shape.n_group, shape.topk_group))
    g = dict(device="cuda", dtype=torch.bfloat16)
    weights = ExpertWeights.dense(torch.randn(shape.E, 2 * shape.I, shape.D, **g) * 0.02,
                                  torch.randn(shape.E, shape.D, shape.I, **g) * 0.02)

    def run(backend):
        def fn(x, logits):
            w, ids = backend.select_experts(logits, spec.router, None)
            perm = backend.permute(x, ids, spec.num_experts)
            y = backend.experts(perm.x_sorted, perm.offsets, weights).y
            return backend.unpermute(y, perm.sorted_copy_ids, w, None)
        return fn

    return spec, run(TritonBackend()), run(TorchBackend())


def bench_shape(shape: Shape, batch_sizes, peaks) -> list[str]:
    spec, triton_fn, torch_fn = _paths(shape)
    rows = []
    for m in batch_sizes:
        x = torch.randn(m, shape.D, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(m, shape.E, device="cuda")
        t_tri, t_ref = median_ms(lambda: triton_fn(x, logits)), median_ms(lambda: torch_fn(x, logits))
        active = min(shape.E, m * shape.K)  # upper bound on experts touched
        flop = 2 * m * shape.K * 3 * shape.D * shape.I
        nbytes = active * 3 * shape.D * shape.I * 2 + (2 * m + m * shape.K) * shape.D * 2
        tflops, gbs = flop / (t_tri * 1e-3) / 1e12, nbytes / (t_tri * 1e-3) / 1e9
        rows.append(f"{shape.name:<16}{m:>6}{t_tri:>10.3f}{t_ref:>10.3f}{t_ref / t_tri:>8.2f}x"
                    f"{tflops:>9.1f} ({100 * tflops * 1e12 / peaks[0]:4.1f}%){gbs:>9.0f} ({100 * gbs * 1e9 / peaks[1]:4.1f}%)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run, not the real layers)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe_kernels needs a CUDA device; none found", file=sys.stderr)
        return 1
    peaks = measure_peaks()
    print(f"device {torch.cuda.get_device_name()}: peak {peaks[0] / 1e12:.0f} TFLOP/s bf16 matmul, "
          f"{peaks[1] / 1e9:.0f} GB/s copy")
    print(f"{'shape':<16}{'M':>6}{'triton ms':>10}{'torch ms':>10}{'speedup':>9}{'TFLOP/s (% peak)':>18}"
          f"{'GB/s (% peak)':>16}")
    for shape in QUICK if args.quick else SHAPES:
        for row in bench_shape(shape, args.batch_sizes, peaks):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
