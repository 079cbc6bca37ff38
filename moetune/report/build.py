"""Run dir → report file (markdown with its PNGs beside it, or one self-contained HTML file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from moetune.errors import MoetuneError

FORMATS = ("md", "html")


def default_report_path(run_dir: Path, fmt: str) -> Path:
    return Path(run_dir) / f"report.{fmt}"


def write_report(run_dir: Path, fmt: str = "html", out: Path | None = None) -> Path:
    return write_reports(run_dir, [fmt], out)[0]


def write_reports(run_dir: Path, formats: list[str], out: Path | None = None) -> list[Path]:
    """Render the run once per format (plots drawn once); `out` only with a single format."""
    from moetune.profile.rundir import read_run
    from moetune.report.plots import all_plots

    for fmt in formats:
        if fmt not in FORMATS:
            raise MoetuneError(f"--format '{fmt}' is not supported; choose md or html")
    if out is not None and not Path(out).parent.is_dir():
        raise MoetuneError(f"cannot write report '{out}': directory '{Path(out).parent}' does not exist")
    run = read_run(Path(run_dir))
    plots = all_plots(run.tables, run.summary)
    paths = [Path(out) if out is not None else default_report_path(run_dir, fmt) for fmt in formats]
    for fmt, path in zip(formats, paths):
        (_write_html if fmt == "html" else _write_markdown)(run, plots, path)
    return paths


def _write_html(run, plots, out: Path) -> None:
    from moetune.report.html import render_html

    _write_atomic(out, render_html(run.summary, run.env, plots).encode())


def _write_markdown(run, plots, out: Path) -> None:
    """The markdown file, with its PNGs in `<stem>_files/` beside it."""
    from moetune.report.markdown import render_markdown

    assets = out.parent / f"{out.stem}_files"
    assets.mkdir(exist_ok=True)
    images = {}
    for stem, _, png in plots:
        _write_atomic(assets / f"{stem}.png", png)
        images[stem] = f"{assets.name}/{stem}.png"
    captions = [(stem, caption) for stem, caption, _ in plots]
    _write_atomic(out, render_markdown(run.summary, run.env, captions, images).encode())


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
