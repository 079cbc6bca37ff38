"""Report tables rendered for the terminal with rich."""

from __future__ import annotations

from moetune.report.tables import Table


def rich_table(table: Table):
    from rich.table import Table as RichTable

    out = RichTable(title=table.title, caption=table.note or None, title_justify="left", caption_justify="left")
    for column in table.columns:  # too narrow (piped: 80 columns): fold onto more lines, never cut to "disp…"
        out.add_column(column, overflow="fold")
    for row in table.rows:
        out.add_row(*[str(c) for c in row])
    return out
