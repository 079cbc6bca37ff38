"""Markdown report: pure function of a run (summary + tables) → text.

Plots are referenced by relative path when the caller saved them (`images`: stem → path).
"""

from __future__ import annotations

from moetune.report.tables import Table, all_tables, figure_tables


def table_markdown(table: Table) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = [f"### {table.title}", "", "| " + " | ".join(cell(c) for c in table.columns) + " |",
             "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table.rows]
    if table.note:
        lines += ["", f"_{table.note}_"]
    return "\n".join(lines) + "\n"


def render_markdown(summary: dict, env: dict, captions: list[tuple[str, str]] | None = None,
                    images: dict[str, str] | None = None) -> str:
    """captions: (stem, caption) of each plot; images: stem → relative path of its saved PNG."""
    m = summary["model"]
    parts = [f"# moetune profile: {m['name']}", "",
             f"moetune {env.get('moetune_version')} · git {str(env.get('git_commit'))[:10]} · torch {env.get('torch')}"
             f" · device {env.get('device', {}).get('name') or env.get('device', {}).get('type')}"
             f" · {env.get('device', {}).get('cpu_count')} CPUs", ""]
    first, *rest = all_tables(summary)  # the overview, then plots, then the detail tables
    parts.append(table_markdown(first))
    beside = figure_tables(summary)
    for stem, caption in captions or []:
        if images and stem in images:
            parts += [f"**{caption}**", "", f"![{caption}]({images[stem]})", ""]
        if stem in beside:
            parts.append(table_markdown(beside[stem]))
    parts += [table_markdown(t) for t in rest]
    return "\n".join(parts)
