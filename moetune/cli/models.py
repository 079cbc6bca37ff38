"""`moetune models`: the models shipped with the package."""

from __future__ import annotations


def models() -> None:
    """List bundled models (usable as --model NAME)."""
    from rich.console import Console
    from rich.table import Table

    from moetune.model.registry import DEFAULT_MODEL, bundled_models

    table = Table("name", "path", "description")
    for m in bundled_models():
        name = f"{m.name} (default)" if m.name == DEFAULT_MODEL else m.name
        table.add_row(name, str(m.path), m.description)
    Console().print(table)
