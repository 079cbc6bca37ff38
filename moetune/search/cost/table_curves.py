"""Reading the measured tables' curves (cost/op_tables.py): one op's seconds at any size by interpolation
(`at`: a 1-D curve over tokens; `at2`: a grid over batch × length), and a hot/low expert mix priced as the
engines would run it, one fused MoE per weight format (`mixed_experts`)."""

from __future__ import annotations

import numpy as np


def at(c: np.ndarray, x) -> np.ndarray:
    """Seconds of curve c at x (0 at x ≤ 0; linear past the last point)."""
    x = np.asarray(x, dtype=np.float64)
    xs, ys = c
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    inside = np.interp(x, xs, ys)
    out = np.where(x > xs[-1], ys[-1] + (x - xs[-1]) * slope, inside)
    return np.where(x > 0, out, 0.0)


def at2(g, x, y) -> np.ndarray:
    """Seconds of grid g at (x, y): bilinear in (batch, length), linear past the grid's last batch and
    below its first (x < 1: that share of one sequence)."""
    bs, ls, sec = g
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    per_len = np.stack([np.interp(y, ls, row) for row in sec], axis=-1)  # [..., nb]
    i = np.clip(np.searchsorted(bs, x) - 1, 0, max(len(bs) - 2, 0))
    if len(bs) == 1:
        return np.where(x > 0, per_len[..., 0] * np.maximum(x, 1) / bs[0], 0.0)
    x0, x1 = bs[i], bs[i + 1]
    y0 = np.take_along_axis(per_len, i[..., None], -1)[..., 0]
    y1 = np.take_along_axis(per_len, (i + 1)[..., None], -1)[..., 0]
    w = (np.maximum(x, bs[0]) - x0) / (x1 - x0)
    out = y0 + w * (y1 - y0)
    return np.where(x > 0, np.where(x < bs[0], out * x / bs[0], out), 0.0)  # a fraction of a batch: its share


def hot_share(hot_fraction: float, E: int) -> float:
    """Of each MoE layer's E experts, the share a hot fraction keeps at full precision (formats.expert_bytes:
    the hottest ceil(hot_fraction · E))."""
    return min(E, int(np.ceil(hot_fraction * E))) / E


def mixed_experts(hot: np.ndarray, low: np.ndarray, hot_rows, low_rows, share: float, n_per_row: float):
    """[...] seconds of a rank's hot/low expert mix as the engines would run it: one fused MoE per weight
    format (a fused-MoE kernel reads one stacked weight tensor of one format), the two in sequence, each
    looked up at its own shape. Each part is the table's fused MoE (all E experts over the EP ranks, the
    rank holding E / ep) at the same rows per expert as the part has, scaled by its share of the rank's
    experts: a part holding share s of the rank's experts with r rows is s · table(r · n_per_row / s)
    (n_per_row = ep / K: the table's N per row of one rank). The rank is assumed to hold the layer's
    share of hot experts (`share`); its rows per format are the trace's (placement applied). At equal
    rows per expert this is s · hot(N) + (1 − s) · low(N), between the all-hot and the all-low op."""
    hot_rows, low_rows = np.asarray(hot_rows, dtype=np.float64), np.asarray(low_rows, dtype=np.float64)
    if share <= 0:
        return at(low, low_rows * n_per_row)
    if share >= 1:
        return at(hot, hot_rows * n_per_row)
    return share * at(hot, hot_rows * n_per_row / share) + (1 - share) * at(low, low_rows * n_per_row / (1 - share))
