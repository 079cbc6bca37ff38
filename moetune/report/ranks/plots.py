"""The per-rank timeline of a run on R ranks (matplotlib, Agg): who computed, who waited, for whom."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.profile.ranks.analysis import slowest_ranks
from moetune.report.figure import figure, png

RANK_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974"]


def rank_timeline(rank_steps: pd.DataFrame, rank_moe: pd.DataFrame) -> bytes:
    """Top: one lane per rank over the measured lock-steps (each as long as its slowest rank): compute,
    the dispatch/combine transfers, then the seconds spent waiting for the slowest rank. Bottom: per MoE layer (rows) and lock-step
    (columns), the rank everyone waited for."""
    R = int(rank_steps["rank"].max()) + 1
    plt, fig = figure(11, 2.2 + 0.45 * R + 0.3 * rank_moe.layer.nunique())
    lanes, grid = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    _lanes(lanes, rank_steps, rank_moe, R)
    _waited_grid(fig, grid, rank_moe, R)
    return png(plt, fig)


def lane_segments(rank_steps: pd.DataFrame, rank_moe: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per lock-step and rank [S, R], ms: "waiting" for the slowest rank (the counts exchange of
    every layer's dispatch), "transfer" (the rows' all-to-alls of dispatch and combine) and
    "computing" (the rest of the rank's step); the three add up to the rank's step time."""
    secs = rank_steps.pivot_table(index="step", columns="rank", values="seconds", fill_value=0.0)  # [S, R]

    def per_step(column: str) -> pd.DataFrame:
        return rank_moe.pivot_table(index="step", columns="rank", values=column, aggfunc="sum",
                                    fill_value=0.0).reindex(index=secs.index, columns=secs.columns, fill_value=0.0)

    wait, transfer = per_step("wait_seconds"), per_step("transfer_seconds")
    transfer = transfer.clip(upper=(secs - wait).clip(lower=0.0))  # timer noise never exceeds the step
    computing = (secs - wait - transfer).clip(lower=0.0)
    return {"computing": computing * 1e3, "transfer": transfer * 1e3, "waiting": wait * 1e3, "step": secs * 1e3}


def _lanes(ax, rank_steps: pd.DataFrame, rank_moe: pd.DataFrame, R: int) -> None:
    seg = lane_segments(rank_steps, rank_moe)
    idle = rank_steps.pivot_table(index="step", columns="rank", values="rank_kind",
                                  aggfunc=lambda k: (k == "idle").any()).reindex_like(seg["step"]).fillna(False)
    starts = np.concatenate([[0.0], np.cumsum(seg["step"].max(axis=1).to_numpy())[:-1]])  # [S] ms
    for r in range(R):
        busy, moved, w = (seg[k][r].to_numpy() for k in ("computing", "transfer", "waiting"))
        colors = np.where(idle[r].to_numpy(dtype=bool), "#c8c8c8", "#4c72b0")
        ax.barh(r, busy, left=starts, color=colors, height=0.6, label="computing" if r == 0 else None)
        ax.barh(r, moved, left=starts + busy, color="#8172b3", height=0.6,
                label="dispatch / combine transfer" if r == 0 else None)
        ax.barh(r, w, left=starts + busy + moved, color="#e34a33", height=0.6,
                label="waiting for the slowest rank" if r == 0 else None)
    ax.set_yticks(range(R), [f"rank {r}" for r in range(R)])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first measured lock-step (each lock-step as long as its slowest rank; grey = idle)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Per-rank timeline")


def _waited_grid(fig, ax, rank_moe: pd.DataFrame, R: int) -> None:
    from matplotlib.colors import ListedColormap

    slow = slowest_ranks(rank_moe).pivot_table(index="layer", columns="step", values="slowest")  # [Lm, S]
    cmap = ListedColormap([RANK_COLORS[r % len(RANK_COLORS)] for r in range(R)])
    im = ax.imshow(slow.to_numpy(dtype=float), aspect="auto", cmap=cmap, vmin=-0.5, vmax=R - 0.5,
                   interpolation="nearest")
    ax.set_yticks(range(len(slow.index)), [str(l) for l in slow.index])
    ax.set_ylabel("MoE layer")
    ax.set_xlabel("lock-step")
    ax.set_title("Rank everyone waited for (arrived last at the layer's all-to-all)")
    bar = fig.colorbar(im, ax=ax, ticks=range(R), fraction=0.03)
    bar.ax.set_yticklabels([f"rank {r}" for r in range(R)])
