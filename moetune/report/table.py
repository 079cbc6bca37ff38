"""The report's one table shape (plain rows, rendered by markdown, html and rich alike) and the cell
formats every table module shares."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
    align_right: list[bool] = field(default_factory=list)


def mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def num(value, fmt: str) -> str:
    return "–" if value is None or value != value else format(value, fmt)
