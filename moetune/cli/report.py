"""`moetune report`: a profile run dir → markdown or one self-contained HTML file."""

from __future__ import annotations

from typing import Optional

import typer


def report(
    run_dir: str = typer.Argument(..., help="Run directory written by `moetune profile`."),
    format: str = typer.Option("html", "--format", "-f", help="md | html"),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Report file (default: RUN_DIR/report.<format>)."),
) -> None:
    """Render a profile run as markdown (plots saved beside it) or a single HTML file."""
    from pathlib import Path

    from moetune.cli import checks
    from moetune.errors import MoetuneError
    from moetune.profile.reader import RunReader
    from moetune.report.build import FORMATS, default_report_path, write_report

    if format not in FORMATS:
        raise MoetuneError(f"--format '{format}' is not supported; choose md or html")
    RunReader(Path(run_dir))  # the run dir exists before its output path is judged
    target = Path(out) if out else default_report_path(Path(run_dir), format)
    checks.output_file("--out" if out else "report file", target)
    path = write_report(Path(run_dir), format, Path(out) if out else None)
    print(path)
