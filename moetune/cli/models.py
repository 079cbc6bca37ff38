"""`moetune models`: the models shipped with the package."""

from __future__ import annotations

from moetune.cli.options import OutputFormatOpt


def models(fmt: str = OutputFormatOpt) -> None:
    """List bundled models (usable as --model NAME)."""
    from moetune.model.registry import DEFAULT_MODEL, bundled_models
    from moetune.report.table import Table
    from moetune.report.terminal import Printer

    printer = Printer(fmt)
    rows = [[f"{m.name} (default)" if m.name == DEFAULT_MODEL else m.name, str(m.path), m.description]
            for m in bundled_models()]
    printer.table(Table("", ["name", "path", "description"], rows))
