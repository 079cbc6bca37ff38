"""Sweep launch configs of the two expert GEMMs on real routing, per batch size (CUDA only).

For each batch size M and each BLOCK_SIZE_M, the w13 (gate_up) and w2 (down) launches are timed
separately over every candidate tile; the best pair of one BLOCK_SIZE_M wins (the aligned layout
is shared by both launches). Times are medians of CUDA-event timings after warm-up, summed over
the sampled layers' routings.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Literal

import torch

from moetune.kernels.configs import ConfigTable, GemmConfig

Search = Literal["small", "full"]
_SPACES = {
    "small": dict(block_m=(16, 32, 64, 128), block_n=(64, 128), block_k=(64, 128), group_m=(1, 16),
                  num_warps=(4, 8), num_stages=(3, 4)),
    "full": dict(block_m=(16, 32, 64, 128), block_n=(32, 64, 128, 256), block_k=(64, 128, 256),
                 group_m=(1, 16, 32, 64), num_warps=(4, 8), num_stages=(2, 3, 4, 5)),
}


@dataclass(frozen=True)
class ExpertProblem:
    """One layer's GEMM operands for a batch: x [M, D], w13 [E, 2I, D], w2 [E, D, I], topk_ids [M, K]."""

    x: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor
    topk_ids: torch.Tensor


def candidates(search: Search = "small") -> list[GemmConfig]:
    space = _SPACES[search]
    keys = list(space)
    return [GemmConfig(**dict(zip(keys, values))) for values in itertools.product(*space.values())]


def median_ms(fn: Callable[[], None], warmup: int = 3, repeat: int = 10) -> float:
    """Median wall time of fn on the current CUDA stream, in milliseconds (CUDA events)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def best_pair(up_ms: dict[GemmConfig, float], down_ms: dict[GemmConfig, float]) -> tuple[GemmConfig, GemmConfig]:
    """Fastest (w13, w2) configs sharing one BLOCK_SIZE_M (minimum of the summed time)."""
    best = None
    for block_m in sorted({c.block_m for c in up_ms} & {c.block_m for c in down_ms}):
        up = min((c for c in up_ms if c.block_m == block_m), key=up_ms.get)
        dn = min((c for c in down_ms if c.block_m == block_m), key=down_ms.get)
        total = up_ms[up] + down_ms[dn]
        if best is None or total < best[0]:
            best = (total, up, dn)
    if best is None:
        raise ValueError("no timed configs share a BLOCK_SIZE_M")
    return best[1], best[2]


def time_configs(problems: list[ExpertProblem], configs: Iterable[GemmConfig]
                 ) -> tuple[dict[GemmConfig, float], dict[GemmConfig, float]]:
    """(w13 times, w2 times) in ms, each summed over the problems; configs that fail to compile
    (e.g. out of shared memory) are left out."""
    from moetune.kernels.align import align_block_size
    from moetune.kernels.fused_experts import down, gate_up
    from moetune.kernels.quant_formats import plain

    up_ms, down_ms = {}, {}
    for cfg in configs:
        try:
            tu = td = 0.0
            for p in problems:
                layout = align_block_size(p.topk_ids, p.w13.shape[0], cfg.block_m)
                h = torch.empty(layout.sorted_token_ids.shape[0], p.w2.shape[2], dtype=p.x.dtype, device=p.x.device)
                out = torch.empty(p.topk_ids.numel(), p.x.shape[1], dtype=p.x.dtype, device=p.x.device)
                tu += median_ms(lambda: gate_up(p.x, plain(p.w13), layout, cfg, h))
                td += median_ms(lambda: down(h, plain(p.w2), layout, cfg, out, None))
        except Exception:  # noqa: BLE001 — an invalid tile for this GPU is simply not a candidate
            continue
        up_ms[cfg], down_ms[cfg] = tu, td
    return up_ms, down_ms


def tune(problems_for: Callable[[int], list[ExpertProblem]], batch_sizes: Iterable[int],
         search: Search = "small", on_batch: Callable[[int, GemmConfig, GemmConfig], None] | None = None
         ) -> tuple[ConfigTable, ConfigTable]:
    """(w13 table, w2 table) over batch sizes; problems_for(M) gives the layers' problems at M."""
    up_table, down_table = {}, {}
    space = candidates(search)
    for m in batch_sizes:
        up, dn = best_pair(*time_configs(problems_for(m), space))
        up_table[m], down_table[m] = up, dn
        if on_batch is not None:
            on_batch(m, up, dn)
    return up_table, down_table
