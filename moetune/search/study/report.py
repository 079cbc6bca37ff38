"""The search report (markdown + one self-contained HTML): Pareto plot, parameter importances, the
winner's phase breakdown next to the baseline's, and in words whether and why the winner wins: first
the verdict on the first objective (it is the baseline; it beats it; it does not, and why that can
be), then each figure marked better or worse."""

from __future__ import annotations

import io
from html import escape
from pathlib import Path

from moetune.report.html import CSS, figure_html, table_html
from moetune.report.markdown import table_markdown
from moetune.report.tables import Table
from moetune.search.cost.balance import balance_sentence, gain_sentence
from moetune.search.cost.metrics import OBJECTIVES, Metrics
from moetune.search.cost.op_tables import cost_sentence
from moetune.search.study.forms import form_sentence
from moetune.search.study.optuna_study import TrialRow
from moetune.search.study.tables import phase_table, states_table, trials_table


# a metric's name on axes and in sentences (OBJECTIVES' attributes and the other figures)
LABELS = {"output_tok_s": "output tokens/s", "output_tok_s_per_rank": "output tokens/s per rank",
          "output_tok_s_per_gpu": "output tokens/s per GPU", "tpot_ms": "TPOT (ms)", "ttft_ms": "TTFT (ms)",
          "peak_mem_gb": "peak memory per rank (GB)", "goodput_rps": "goodput (requests/s meeting both SLOs)"}


def _versus(w: float, b: float, lower_better: bool) -> str:
    if w == b or (b and abs(w - b) / abs(b) < 0.005):
        return "the same"
    return "better" if (w < b) == lower_better else "worse"


def verdict(win: Metrics, base: Metrics | None, objective: str, win_label: str, base_label: str) -> str:
    """The first sentence: is the winner the baseline, does it beat it on the first objective, or not (and why
    that can be)."""
    key, direction = OBJECTIVES[objective]
    name, w = LABELS.get(key, key), getattr(win, key)
    if base is None:
        return (f"The baseline ({base_label}) could not run here, so there is nothing to compare with: the winner "
                f"({win_label}) is the best trial, {name} {w:,.4g} ({win.tag}).")
    b = getattr(base, key)
    if win_label == base_label:
        return f"The winner is the baseline deployment ({base_label}): no trial beat it on {name} ({w:,.4g})."
    if _versus(w, b, direction == "minimize") == "better":
        ratio = f" ({w / b:.2f}×)" if b else ""
        return (f"The winner ({win_label}) beats the baseline ({base_label}) on {name}: {w:,.4g} vs "
                f"{b:,.4g}{ratio}, {win.tag} vs {base.tag}.")
    return (f"The winner ({win_label}) does not beat the baseline ({base_label}) on {name}: {w:,.4g} vs {b:,.4g}. "
            f"The baseline was not among the trials (--space keeps some knob away from its value) or it breaks "
            f"a --max-* limit; the winner is the best trial that ran and met the limits.")


def why_it_wins(win: Metrics, base: Metrics) -> list[str]:
    """Sentences comparing the winner to the baseline on what moved: time, imbalance, bytes, memory, stalls,
    each marked better / worse / the same for the winner."""
    out = []
    if base.output_tok_s > 0:
        out.append(f"Output throughput {win.output_tok_s:,.4g} vs {base.output_tok_s:,.4g} tokens/s "
                   f"({_versus(win.output_tok_s, base.output_tok_s, False)}), per rank "
                   f"{win.output_tok_s_per_rank:,.4g} vs {base.output_tok_s_per_rank:,.4g}.")
    out.append(f"TTFT {win.ttft_ms:,.4g} vs {base.ttft_ms:,.4g} ms ({_versus(win.ttft_ms, base.ttft_ms, True)}), "
               f"TPOT {win.tpot_ms:,.4g} vs {base.tpot_ms:,.4g} ms ({_versus(win.tpot_ms, base.tpot_ms, True)}).")
    wd, bd = win.detail, base.detail
    if "rank_imbalance" in wd and win.ranks > 1:
        out.append(f"Expert load across ranks: imbalance (max/mean rows) {wd['rank_imbalance']:.2f}"
                   + (f" vs {bd['rank_imbalance']:.2f}" if base.ranks > 1 else " (baseline has one rank)")
                   + "; the slowest rank sets every MoE layer's time.")
    if wd.get("a2a_bytes") or bd.get("a2a_bytes"):
        out.append(f"All-to-all bytes {wd.get('a2a_bytes', 0) / 1e9:.3g} GB vs {bd.get('a2a_bytes', 0) / 1e9:.3g} GB "
                   f"(across nodes {wd.get('inter_node_bytes', 0) / 1e9:.3g} GB).")
    out.append(f"Peak memory per rank {win.peak_mem_gb:.3g} GB vs {base.peak_mem_gb:.3g} GB "
               f"({_versus(win.peak_mem_gb, base.peak_mem_gb, True)}).")
    if wd.get("offload_stall_s"):
        out.append(f"Offload stalls {wd['offload_stall_s'] * 1e3:.1f} ms in total, cache hit rate "
                   f"{wd.get('cache_hit_rate', 1):.1%}.")
    gain = gain_sentence(win, base)
    if gain:
        out.append(gain)
    wp, bp = _decode_phases(win), _decode_phases(base)
    if wp and bp:
        deltas = sorted(((bp.get(p, 0) - wp.get(p, 0), p) for p in set(wp) | set(bp) if p not in ("step", "steps")),
                        reverse=True)
        gains = [f"{p} −{d:.3g} ms" for d, p in deltas[:3] if d > 0]
        if gains:
            out.append("Per decode step the time saved is mostly in " + ", ".join(gains) + ".")
    return out


def _decode_phases(m: Metrics) -> dict:
    return m.phases_ms.get("decode") or next(iter(m.phases_ms.values()), {})


def pareto_png(rows: list[TrialRow], front: list[TrialRow], objectives: tuple[str, ...]) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.state == "COMPLETE" and r.metrics]
    if not done:
        return None
    y_key = OBJECTIVES[objectives[0]][0]
    x_key = OBJECTIVES[objectives[1]][0] if len(objectives) > 1 else ("tpot_ms" if y_key != "tpot_ms" else "output_tok_s")
    fig = plt.figure(figsize=(6.5, 4.2), dpi=100)
    ax = fig.add_subplot(111)
    ax.scatter([r.metrics[x_key] for r in done], [r.metrics[y_key] for r in done], s=12, c="#999999", label="trials")
    fr = [r for r in front if r.metrics]
    ax.scatter([r.metrics[x_key] for r in fr], [r.metrics[y_key] for r in fr], s=30, c="#c44e52", label="Pareto front")
    tag = "estimated" if done[0].metrics.get("estimated") else "measured"
    ax.set_xlabel(f"{LABELS.get(x_key, x_key)}, {tag}")
    ax.set_ylabel(f"{LABELS.get(y_key, y_key)}, {tag}")
    ax.set_title("Every complete trial; the Pareto front in red", fontsize=10)
    ax.legend()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def importances(study) -> Table:
    import optuna

    try:
        imp = optuna.importance.get_param_importances(study, target=lambda t: t.values[0])
    except Exception as exc:  # too few complete trials or a single value: say so
        return Table("Parameter importances", ["parameter", "importance"], [], f"not computed: {exc}")
    return Table("Parameter importances (first objective, fANOVA)", ["parameter", "importance"],
                 [[k, f"{v:.3f}"] for k, v in imp.items()])


def render(title: str, rows: list[TrialRow], ranked: list[TrialRow], front: list[TrialRow], objectives, study,
           winner: Metrics, baseline: Metrics | None, extra: list[Table], labels: tuple[str, str] = ("", ""),
           phases: tuple[Metrics, Metrics] | None = None, quality_note: str = "",
           figures: list[tuple[str, bytes]] = ()) -> tuple[str, str, bytes | None]:
    """→ (markdown, html, Pareto PNG). baseline None: it could not run. labels: the winner's and the
    baseline's deployments. phases: the pair the per-phase table compares, when not the two above (a
    measured search records no phases: the cost model's estimates of the same two). quality_note: what
    the KL / top-1 columns were measured on (quality.py; the tables have them where trials carry them).
    figures: more plots as (file name, PNG), shown after the Pareto plot (the caller writes the files)."""
    png = pareto_png(rows, front, tuple(objectives))
    why = [verdict(winner, baseline, objectives[0], *labels)]
    why += why_it_wins(winner, baseline) if baseline is not None else []
    win_p, base_p = phases or (winner, baseline)
    why.append("Winner: " + balance_sentence(win_p))
    if "cost_source" in winner.detail:  # simulated on GPU hardware: which tables priced it (op_tables.py)
        why.append(cost_sentence(winner.detail))
    form = form_sentence(rows, objectives[0])  # aggregated vs disaggregated, where both were tried
    why += [form] if form else []
    front_title = f"Pareto front ({len(front)} feasible non-dominated trials)"
    fronts = [trials_table(front, tuple(objectives), top=len(front), title=front_title, quality_note=quality_note)] \
        if len(objectives) > 1 else []  # one objective: its front is the best trial, the table above
    tables = [trials_table(ranked, tuple(objectives), quality_note=quality_note), *fronts,
              states_table(rows), importances(study),
              phase_table("Winner vs baseline, per step kind and phase" + (" (estimated by the cost model: the "
                          "measured trials record no phases)" if phases else ""), win_p, base_p, "baseline"), *extra]
    md = [f"# {title}", "", "## The winner against the baseline", "", *[f"- {s}" for s in why], ""]
    if png:
        md += ["![Pareto front](pareto.png)", ""]
    md += [x for name, _ in figures for x in (f"![{name}]({name})", "")]
    md += [table_markdown(t) for t in tables]
    html = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{escape(title)}</title><style>{CSS}</style>"
            f"</head><body><h1>{escape(title)}</h1><h2>The winner against the baseline</h2><ul>"
            + "".join(f"<li>{escape(s)}</li>" for s in why) + "</ul>"]
    if png:
        html.append(figure_html("Trials and Pareto front", png))
    html += [figure_html(name.rsplit(".", 1)[0].replace("_", " "), data) for name, data in figures]
    html += [table_html(t) for t in tables]
    html.append("</body></html>\n")
    return "\n".join(md), "".join(html), png


def write_report(out: Path, md: str, html: str, png: bytes | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(html)
    written = [out / "report.md", out / "report.html"]
    if png:
        (out / "pareto.png").write_bytes(png)
        written.append(out / "pareto.png")
    return written
