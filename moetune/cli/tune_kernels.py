"""`moetune tune-kernels`: sweep Triton launch configs for the expert GEMMs on real routing (CUDA only)."""

from __future__ import annotations

from typing import List, Optional

import typer

from moetune.cli.options import ModelArgs, model_options


@model_options()
def tune_kernels(
    batch_sizes: List[int] = typer.Option([], "--batch-size", help="Batch size to tune (repeatable; default 1..4096)."),
    out: Optional[str] = typer.Option(None, "--out", help="Folder for the JSON files (default: moetune/kernels/configs)."),
    search: str = typer.Option("small", "--search", help="small | full config space"),
    m: ModelArgs = ModelArgs(),
) -> None:
    """Write vLLM-style `E=..,N=..,device_name=..json` configs for the w13 and w2 GEMMs."""
    from pathlib import Path

    from moetune.bench.kernel_tuning import DEFAULT_BATCH_SIZES, tune_kernels as run
    from moetune.cli import checks
    from moetune.cli.options import apply_threads
    from moetune.errors import UsageError

    if m.kernel_backend not in (None, "triton"):
        raise UsageError(f"--kernel-backend {m.kernel_backend}: tune-kernels tunes the Triton kernels (triton only)")
    cfg = m.checked()
    device = "cuda" if cfg.model.device == "auto" else cfg.model.device
    if not device.startswith("cuda"):
        raise UsageError(f"--device {device}: tune-kernels times the Triton kernels on a CUDA device")
    for b in batch_sizes:
        checks.number("--batch-size", b, 1)
    if out is not None:
        checks.output_dir("--out", Path(out))
    apply_threads(cfg)  # loads torch: after the flags are checked
    dtype = {"auto": "bfloat16", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[cfg.model.dtype]
    paths = run(cfg.model.path, tuple(batch_sizes) or DEFAULT_BATCH_SIZES, out, dtype, search, device=device)
    for path in paths:
        typer.echo(str(path))
