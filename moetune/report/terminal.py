"""Tables and lines on stdout, rendered one way for every command (`Printer`):

- on a terminal, a rich table (cells fold inside the terminal's width);
- piped or redirected (stdout not a terminal), one line per row at the table's natural width: the
  title, the header, the rows (columns padded to their widest cell, numbers right-aligned), the note;
- `--format tsv`, tab-separated rows the csv module reads (`csv.reader(f, delimiter="\\t")`): each
  table its header row first, one blank line between tables; the prose lines go to stderr, so stdout
  holds the tables alone.

Cells are the same strings in every form (a number keeps its thousands separator).
"""

from __future__ import annotations

import csv
import io
import re
import sys
from typing import TextIO

from moetune.errors import UsageError
from moetune.report.table import Table

FORMATS = ("text", "tsv")
_NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+(e[-+]?\d+)?\s?(%|×|x|ms|s|GB|MiB)?$")


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def rich_table(table: Table):
    from rich.table import Table as RichTable

    out = RichTable(title=table.title, caption=table.note or None, title_justify="left", caption_justify="left")
    for i, column in enumerate(table.columns):  # a terminal too narrow folds cells onto more lines, never "disp…"
        out.add_column(column, overflow="fold", justify="right" if _right(table, i) else "left")
    for row in table.rows:
        out.add_row(*[str(c) for c in row])
    return out


def plain_lines(table: Table) -> list[str]:
    """The table as text lines: title, header, one line per row, note; no line wraps."""
    rows = [[_flat(c) for c in row] for row in [table.columns, *table.rows]]
    n = len(table.columns)
    widths = [max((len(r[i]) for r in rows if i < len(r)), default=0) for i in range(n)]
    lines = [table.title] if table.title else []
    for row in rows:
        cells = [(c.rjust if _right(table, i) else c.ljust)(widths[i]) for i, c in enumerate(row[:n])]
        lines.append("  ".join(cells).rstrip())
    if table.note:
        lines.append(_flat(table.note))
    return lines


def tsv_text(table: Table) -> str:
    """The table as tab-separated values: the header row, then the rows (csv quoting where a cell needs it)."""
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t", lineterminator="\n")
    writer.writerow(table.columns)
    writer.writerows([[str(c) for c in row] for row in table.rows])
    return buf.getvalue()


class Printer:
    """Where a command's tables and lines go: `table(t)` and `line(text)`, rendered as the module says."""

    def __init__(self, fmt: str = "text", stream: TextIO | None = None, terminal: bool | None = None):
        self.fmt = check_format(fmt)
        self.stream = stream if stream is not None else sys.stdout
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self._tables = 0

    def table(self, table: Table) -> None:
        if self.fmt == "tsv":
            self.stream.write(("\n" if self._tables else "") + tsv_text(table))
        elif self.terminal:
            self._console().print(rich_table(table))
        else:
            self.stream.write("\n".join(plain_lines(table)) + "\n\n")
        self._tables += 1
        self.stream.flush()

    def line(self, text: str) -> None:
        if self.fmt == "tsv":
            print(text, file=sys.stderr)
        elif self.terminal:
            self._console().print(text, highlight=False, markup=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def _console(self):
        from rich.console import Console

        return Console(file=self.stream)


def _right(table: Table, i: int) -> bool:
    if i < len(table.align_right):
        return table.align_right[i]
    cells = [str(row[i]).strip() for row in table.rows if i < len(row) and str(row[i]).strip() not in ("", "–")]
    return bool(cells) and all(_NUMBER.match(c) for c in cells)


def _flat(cell) -> str:
    return " ".join(str(cell).split("\n")).replace("\t", " ")
