"""`moetune tune-kernels`: sweep Triton launch configs for the expert GEMMs on real routing (CUDA only)."""

from __future__ import annotations

from typing import List, Optional

import typer

from moetune.cli.options import ModelOpt


def tune_kernels(
    model: Optional[str] = ModelOpt,
    batch_sizes: List[int] = typer.Option([], "--batch-size", help="Batch size to tune (repeatable; default 1..4096)."),
    out: Optional[str] = typer.Option(None, "--out", help="Folder for the JSON files (default: moetune/kernels/configs)."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16 | float16 | float32"),
    search: str = typer.Option("small", "--search", help="small | full config space"),
) -> None:
    """Write vLLM-style `E=..,N=..,device_name=..json` configs for the w13 and w2 GEMMs."""
    from pathlib import Path

    from moetune.bench.kernel_tuning import DEFAULT_BATCH_SIZES, tune_kernels as run
    from moetune.cli import checks

    for b in batch_sizes:
        checks.number("--batch-size", b, 1)
    if out is not None:
        checks.output_dir("--out", Path(out))
    paths = run(model, tuple(batch_sizes) or DEFAULT_BATCH_SIZES, out, dtype, search)
    for path in paths:
        typer.echo(str(path))
