"""A matplotlib figure on the Agg backend (imported on the first plot, not at import time) and its PNG
bytes: shared by the run's plots (plots.py) and the per-rank ones (ranks/plots.py)."""

from __future__ import annotations

import io


def figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt, plt.figure(figsize=(width, height), dpi=100)


def png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
