"""Report plots (matplotlib, Agg backend): each function takes run tables, returns PNG bytes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.profile.trace import KINDS
from moetune.report.figure import figure, png
from moetune.report.ranks.plots import rank_timeline
from moetune.report.speculative import CAPTION, STEM, by_batch, speculation_plot

PHASE_COLORS = {"attention": "#4c72b0", "router": "#dd8452", "permute": "#55a868", "dispatch": "#c44e52",
                "experts": "#8172b3", "combine": "#937860", "shared_expert": "#da8bc3", "unpermute": "#8c8c8c",
                "dense_mlp": "#ccb974", "offload_wait": "#64b5cd", "other": "#d0d0d0"}


def _kinds(df: pd.DataFrame) -> list[str]:
    return [k for k in KINDS if k in set(df.kind)]


def load_heatmap(expert_load: pd.DataFrame) -> bytes:
    """Share of each layer's token copies per expert: layer × expert, one panel per kind."""
    kinds = _kinds(expert_load)
    plt, fig = figure(11, 1.2 + 0.9 * len(kinds) * max(expert_load.layer.nunique(), 1) ** 0.5 + 1.5)
    for i, kind in enumerate(kinds, 1):
        pivot = expert_load[expert_load.kind == kind].pivot_table(
            index="layer", columns="expert", values="tokens", aggfunc="sum", fill_value=0)
        counts = pivot.to_numpy(dtype=float)  # [Lm, E]
        share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1) * counts.shape[1]  # 1.0 = fair share
        ax = fig.add_subplot(len(kinds), 1, i)
        im = ax.imshow(share, aspect="auto", cmap="magma", interpolation="nearest")
        ax.set_yticks(range(len(pivot.index)), [str(l) for l in pivot.index])
        ax.set_ylabel("layer")
        ax.set_xlabel("expert")
        ax.set_title(f"{kind}: tokens per expert ÷ fair share (1.0 = even)")
        fig.colorbar(im, ax=ax, fraction=0.03)
    return png(plt, fig)


def phase_bars(phases: pd.DataFrame, steps: pd.DataFrame) -> bytes:
    """Stacked horizontal bars: % of step time per phase, prefill vs decode."""
    kinds = _kinds(steps)
    plt, fig = figure(11, 1.6 + 0.6 * len(kinds))
    ax = fig.add_subplot(1, 1, 1)
    order = [p for p in PHASE_COLORS if p in set(phases.phase)]
    for y, kind in enumerate(kinds):
        total = steps[steps.kind == kind].seconds.sum()
        per = phases[phases.kind == kind].groupby("phase").seconds.sum()
        left = 0.0
        for phase in order:
            share = 100 * per.get(phase, 0.0) / total if total else 0.0
            ax.barh(y, share, left=left, color=PHASE_COLORS[phase], label=phase if y == 0 else None)
            if share > 4:
                ax.text(left + share / 2, y, f"{share:.0f}%", ha="center", va="center", fontsize=8)
            left += share
    ax.set_yticks(range(len(kinds)), kinds)
    ax.set_xlabel("% of step time")
    ax.set_xlim(0, 100)
    ax.legend(ncol=2, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Phase breakdown")
    return png(plt, fig)


def rank_load_bars(ep_ranks: pd.DataFrame) -> bytes:
    """Token copies per rank for each MoE layer (grouped bars), one panel per kind."""
    kinds = _kinds(ep_ranks)
    plt, fig = figure(11, 1 + 2.6 * len(kinds))
    for i, kind in enumerate(kinds, 1):
        pivot = ep_ranks[ep_ranks.kind == kind].pivot_table(index="layer", columns="rank", values="copies",
                                                            aggfunc="sum", fill_value=0)  # [Lm, R]
        ax = fig.add_subplot(len(kinds), 1, i)
        R = pivot.shape[1]
        width = 0.8 / R
        x = np.arange(len(pivot.index))
        for r in range(R):
            ax.bar(x + r * width - 0.4 + width / 2, pivot.iloc[:, r], width, label=f"rank {pivot.columns[r]}")
        mean = pivot.to_numpy().mean(axis=1)
        ax.scatter(x, mean, color="black", marker="_", s=400, zorder=3, label="mean")
        ax.set_xticks(x, [f"layer {l}" for l in pivot.index])
        ax.set_ylabel("token copies")
        ax.set_title(f"{kind}: load per EP rank")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return png(plt, fig)


def mshape_histogram(expert_load: pd.DataFrame, block_m: bool = True) -> bytes:
    """Histogram of expert GEMM m-shapes (rows per non-empty expert per step and layer); `block_m`:
    mark the triton kernels' BLOCK_M (only they pad rows to it)."""
    kinds = _kinds(expert_load)
    plt, fig = figure(11, 1 + 2.4 * len(kinds))
    for i, kind in enumerate(kinds, 1):
        rows = expert_load[(expert_load.kind == kind) & (expert_load.tokens > 0)].tokens.to_numpy()
        ax = fig.add_subplot(len(kinds), 1, i)
        top = int(rows.max()) if len(rows) else 1
        if top <= 64:  # one bar per m value
            bins = np.arange(0.5, top + 1.5)
        else:  # log-spaced integer bins
            bins = np.unique(np.geomspace(1, top + 1, 40).astype(int)) - 0.5
            ax.set_xscale("log")
        ax.hist(rows, bins=bins, color="#4c72b0", edgecolor="white")
        if block_m and top >= 32:
            ax.axvline(64, color="#c44e52", linestyle="--", linewidth=1, label="BLOCK_M = 64")
            ax.legend(fontsize=8)
        ax.set_xlabel("rows in one expert GEMM (m)")
        ax.set_ylabel("GEMMs")
        empty = int(((expert_load.kind == kind) & (expert_load.tokens == 0)).sum())
        ax.set_title(f"{kind}: GEMM m-shapes ({len(rows)} GEMMs, {empty} experts idle)")
    return png(plt, fig)


def offload_bars(offload: dict) -> bytes:
    """Per MoE layer: cache hit rate and offload_wait (ms over the measured steps)."""
    layers = sorted(offload["layers"], key=int)
    hit = [100 * offload["layers"][k]["hit_rate"] for k in layers]
    wait = [1e3 * offload["layers"][k]["offload_wait_s"] for k in layers]
    plt, fig = figure(11, 3.2)
    for i, (values, label, color) in enumerate(((hit, "hit rate %", "#55a868"), (wait, "offload_wait ms", "#64b5cd")), 1):
        ax = fig.add_subplot(1, 2, i)
        ax.bar([str(k) for k in layers], values, color=color)
        ax.set_xlabel("MoE layer")
        ax.set_ylabel(label)
    return png(plt, fig)


def all_plots(tables, summary: dict | None = None) -> list[tuple[str, str, bytes]]:
    """(file stem, caption, PNG) for every figure of a report, from a run's RunTables (and summary)."""
    extra = []
    if summary is not None and summary.get("offload", {}).get("enabled"):
        extra.append(("offload", "Expert offloading: cache hit rate and offload_wait per layer",
                      offload_bars(summary["offload"])))
    plots = [
        ("phases", "Phase breakdown, prefill vs decode (% of step time)", phase_bars(tables.phases, tables.steps)),
        ("expert_load", "Expert load heatmap (layer × expert)", load_heatmap(tables.expert_load)),
    ]
    if len(tables.ep_ranks) and tables.ep_ranks["rank"].nunique() > 1:  # at R = 1 one rank holds every copy
        plots.append(("rank_load", "Load per EP rank under the chosen placement", rank_load_bars(tables.ep_ranks)))
    on_gpu = summary is None or str(summary["model"].get("device", "")).startswith("cuda")
    plots += [("gemm_m_shapes", "Expert GEMM m-shape histogram", mshape_histogram(tables.expert_load, on_gpu))] + extra
    spec = by_batch(summary) if summary is not None else []
    if spec:
        plots.append((STEM, CAPTION, speculation_plot(spec, summary["speculative"]["method"], summary["model"]["E"])))
    if len(tables.rank_moe):
        plots.append(("rank_timeline",
                      "Per-rank timeline: computing, dispatch/combine transfer, waiting, and for whom (measured)",
                      rank_timeline(tables.rank_steps, tables.rank_moe)))
    return plots
