"""Load metrics as pure functions over token counts (docs/architecture.md §2).

Per layer: `imbalance = max / mean` and `balancedness = mean / max`, over experts and over
ranks. An average over layers is always taken over the per-layer values, never over counts
summed across layers (summing first hides skew that moves from layer to layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LoadStats:
    mean: float
    max: float
    imbalance: float  # max / mean (1.0 = perfectly even)
    balancedness: float  # mean / max (1.0 = perfectly even)
    p50: float
    p95: float
    p99: float


def load_stats(counts: np.ndarray) -> LoadStats:
    """counts: [N] tokens per expert (or per rank) of one layer."""
    counts = np.asarray(counts, dtype=np.float64)
    mean, peak = float(counts.mean()), float(counts.max())
    p50, p95, p99 = (float(v) for v in np.percentile(counts, [50, 95, 99]))
    if peak == 0:
        return LoadStats(0.0, 0.0, 1.0, 1.0, p50, p95, p99)
    return LoadStats(mean, peak, peak / mean, mean / peak, p50, p95, p99)


def per_layer_stats(counts: np.ndarray) -> list[LoadStats]:
    """counts: [L, N] tokens per layer and expert (or rank) → one LoadStats per layer."""
    return [load_stats(row) for row in np.asarray(counts)]


def mean_over_layers(stats: list[LoadStats], field: str) -> float:
    """Average of a per-layer value (e.g. "balancedness") over layers."""
    return float(np.mean([getattr(s, field) for s in stats])) if stats else float("nan")


def rank_loads(counts: np.ndarray, placement: np.ndarray, num_ranks: int) -> np.ndarray:
    """counts: [L, E] per expert, placement: [E] owning rank → [L, R] tokens per rank."""
    counts = np.asarray(counts)
    out = np.zeros((counts.shape[0], num_ranks), dtype=counts.dtype)  # [L, R]
    for rank in range(num_ranks):
        out[:, rank] = counts[:, placement == rank].sum(axis=1)
    return out


def hottest_experts(counts: np.ndarray, layers: list[int], top: int = 5) -> list[dict]:
    """counts: [L, E] → the `top` (layer, expert) pairs by share of their layer's token copies."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)  # [L, 1]
    share = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)  # [L, E]
    order = np.argsort(share, axis=None)[::-1][:top]
    rows = []
    for flat in order:
        li, expert = np.unravel_index(flat, share.shape)
        fair = 1.0 / counts.shape[1]
        rows.append({"layer": int(layers[li]), "expert": int(expert), "tokens": int(counts[li, expert]),
                     "share": float(share[li, expert]), "x_fair_share": float(share[li, expert] / fair)})
    return rows


def padding_waste(rows: int, padded_rows: int) -> float:
    """Fraction of GEMM rows that are padding after aligning each expert to BLOCK_M."""
    return 0.0 if padded_rows == 0 else (padded_rows - rows) / padded_rows


def padded_rows(counts: np.ndarray, block_m: int) -> int:
    """Rows after padding each non-empty expert's segment to a multiple of block_m."""
    counts = np.asarray(counts, dtype=np.int64)
    return int((((counts + block_m - 1) // block_m) * block_m).sum())


def expert_capacity(tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Copies one expert may take in a step: ceil(cf · T·K / E)."""
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def dropped_copies(counts: np.ndarray, capacity: int) -> int:
    """counts: [E] copies per expert in one step and layer → copies over capacity."""
    return int(np.clip(np.asarray(counts, dtype=np.int64) - capacity, 0, None).sum())
