"""`moetune quantize`: a checkpoint → a mixed-precision checkpoint (a format per layer × expert)."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import ModelArgs, model_options


@model_options("source")
def quantize(
    policy: Optional[str] = typer.Option(None, "--policy", help="FORMAT for every expert (fp32 bf16 fp16 fp8 int8 "
                                         "int4-g32/64/128), or hot=F,high=FORMAT,low=FORMAT (needs --loads)."),
    table: Optional[str] = typer.Option(None, "--table", help="JSON precision table (moetune/quant/table.py)."),
    loads: Optional[str] = typer.Option(None, "--loads", help="Run directory of `moetune profile`: expert loads "
                                        "that rank the experts for hot=F."),
    out: str = typer.Option(..., "--out", "-o", help="Directory of the mixed checkpoint to write."),
    m: ModelArgs = ModelArgs(),
) -> None:
    """Pack each routed expert in its own format; attention, router and shared experts are copied."""
    from pathlib import Path

    from moetune.cli import checks
    from moetune.cli.options import apply_threads
    from moetune.errors import UsageError
    from moetune.model.registry import resolve_model
    from moetune.model.validate import read_spec, validate_checkpoint
    from moetune.quant.table import hot_fraction, parse_policy, read_table, uniform

    if (policy is None) == (table is None):
        raise UsageError("give exactly one of --policy or --table")
    cfg = m.config()  # --recipe: its model (its quant and offload sections are a run's, not this checkpoint's)
    apply_threads(cfg)
    model_dir = resolve_model(cfg.model.path)
    if Path(out).absolute() == model_dir.absolute():
        raise UsageError(f"--out '{out}' is the source checkpoint; write the quantized one elsewhere")
    checks.output_dir("--out", Path(out))
    spec = read_spec(model_dir)
    validate_checkpoint(model_dir, spec)
    layers, E = list(spec.moe_layers), spec.moe.num_experts
    if table is not None:
        precision = read_table(Path(table), layers, E)
    else:
        chosen = parse_policy(policy)
        if "experts" in chosen:
            precision = uniform(chosen["experts"], layers, E)
        else:
            if loads is None:
                raise UsageError(f"--policy {policy} ranks experts by load: give --loads RUN_DIR (moetune profile --out)")
            from moetune.quant.loads import read_expert_loads

            precision = hot_fraction(read_expert_loads(loads, layers, E), layers, chosen["hot_fraction"],
                                     chosen["high"], chosen["low"])
    from moetune.model.loader import check_precision
    from moetune.model.quant_checkpoint import read_quantization
    from moetune.model.quantize import write_quantized

    check_precision(read_quantization(model_dir, spec), precision, spec, "torch")  # every refusal before writing
    from moetune.cli.progress import progress

    with progress("quantize") as bar:
        bar.phase("packing layers", total=len(layers))
        sizes = write_quantized(model_dir, spec, precision, Path(out), on_layer=lambda done, _: bar.update(done=done))
        bar.phase("writing the checkpoint")
    mix = ", ".join(f"{n} {c}" for n, c in sorted(precision.counts().items()))
    print(f"experts: {mix}; expert bytes {sizes['expert_bytes_before'] / 1e6:.2f} MB → "
          f"{sizes['expert_bytes_after'] / 1e6:.2f} MB; wrote {out}")
