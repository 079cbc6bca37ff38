"""HTML report: one self-contained file (inline CSS, plots as base64 PNG; no network resources)."""

from __future__ import annotations

import base64
import re
from html import escape

from moetune.report.tables import Table, all_tables, figure_tables

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.88em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1em 0; } figcaption { font-weight: 600; margin-bottom: 0.3em; }
img { max-width: 100%; } .pair { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; } .note { color: #666; font-size: 0.85em; } .meta { color: #555; }
code { background: #f4f4f4; padding: 0 3px; border-radius: 3px; }
"""


def inline(text: str) -> str:
    """Escaped text with markdown's `code` spans as <code> (the notes are written for markdown too)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def table_html(table: Table) -> str:
    head = "".join(f"<th>{inline(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{inline(str(c))}</td>" for c in row) + "</tr>" for row in table.rows)
    note = f'<p class="note">{inline(table.note)}</p>' if table.note else ""
    return f"<h2>{escape(table.title)}</h2><table><tr>{head}</tr>{body}</table>{note}"


def figure_html(caption: str, png: bytes, beside: Table | None = None) -> str:
    """The plot inline (base64); `beside`: a table shown next to it (below on a narrow page)."""
    data = base64.b64encode(png).decode("ascii")
    img = f'<img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
    if beside is not None:
        img = f'<div class="pair">{img}<div>{table_html(beside)}</div></div>'
    return f'<figure><figcaption>{escape(caption)}</figcaption>{img}</figure>'


def render_html(summary: dict, env: dict, plots: list[tuple[str, str, bytes]]) -> str:
    """plots: (stem, caption, PNG bytes) from `moetune.report.plots.all_plots`."""
    m, dev = summary["model"], env.get("device", {})
    meta = (f"moetune {env.get('moetune_version')} · git {str(env.get('git_commit'))[:10]} · torch {env.get('torch')}"
            f" · device {dev.get('name') or dev.get('type')} · {dev.get('cpu_count')} CPUs")
    beside = figure_tables(summary)
    figures = "".join(figure_html(caption, png, beside.get(stem)) for stem, caption, png in plots)
    every = all_tables(summary)  # the overview (and the deployment), then plots, then the detail tables
    lead = 2 if len(every) > 1 and every[1].title == "Deployment" else 1
    first = "".join(table_html(t) for t in every[:lead])
    tables = "".join(table_html(t) for t in every[lead:])
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>moetune profile: {escape(m['name'])}</title>"
            f"<style>{CSS}</style></head><body><h1>moetune profile: {escape(m['name'])}</h1>"
            f'<p class="meta">{escape(meta)}</p>{first}<h2>Plots</h2>{figures}{tables}</body></html>\n')
