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
    dense: Optional[str] = typer.Option(None, "--dense", help="int8 | int4-g32/64/128: pack every dense projection "
                                        "too (attention, dense and shared-expert MLPs, the LM head)."),
    out: str = typer.Option(..., "--out", "-o", help="Directory of the mixed checkpoint to write."),
    m: ModelArgs = ModelArgs(),
) -> None:
    """Pack each routed expert in its own format (--policy / --table) and/or the dense projections
    (--dense); the router, norms and embedding are copied."""
    from pathlib import Path

    from moetune.cli import checks
    from moetune.cli.options import apply_threads
    from moetune.errors import UsageError
    from moetune.model.registry import resolve_model
    from moetune.model.validate import read_spec, validate_checkpoint

    if policy is not None and table is not None:
        raise UsageError("give one of --policy or --table, not both")
    if policy is None and table is None and dense is None:
        raise UsageError("give --policy or --table (the experts' formats) and/or --dense (the dense projections')")
    cfg = m.config()  # --recipe: its model (its quant and offload sections are a run's, not this checkpoint's)
    model_dir = resolve_model(cfg.model.path)
    if Path(out).absolute() == model_dir.absolute():
        raise UsageError(f"--out '{out}' is the source checkpoint; write the quantized one elsewhere")
    checks.output_dir("--out", Path(out))
    spec = read_spec(model_dir)
    validate_checkpoint(model_dir, spec)
    from moetune.model.quant_checkpoint import read_block
    from moetune.quant.names import parse_dense

    if read_block(model_dir) is not None:
        raise UsageError(f"'{model_dir}' is already quantized by moetune quantize; start from its full-precision source")
    if dense is not None:
        parse_dense(dense)
    precision = _precision(policy, table, loads, spec) if policy is not None or table is not None else None
    from moetune.model.loader import check_precision
    from moetune.model.quantize import write_quantized

    if precision is not None:
        check_precision(None, precision, spec, "torch")  # every refusal before writing
    from moetune.cli.progress import progress

    apply_threads(cfg)  # loads torch: after every refusal above
    with progress("quantize") as bar:
        if precision is not None:
            bar.phase("packing layers", total=len(spec.moe_layers))
        else:
            bar.phase("packing the dense projections")
        sizes = write_quantized(model_dir, spec, precision, Path(out), dense,
                                on_layer=lambda done, _: bar.update(done=done))
        bar.phase("writing the checkpoint")
    parts = []
    if precision is not None:
        mix = ", ".join(f"{n} {c}" for n, c in sorted(precision.counts().items()))
        parts.append(f"experts: {mix}; expert bytes {sizes['expert_bytes_before'] / 1e6:.2f} MB → "
                     f"{sizes['expert_bytes_after'] / 1e6:.2f} MB")
    if dense is not None:
        parts.append(f"dense projections: {dense}; {sizes['dense_bytes_before'] / 1e6:.2f} MB → "
                     f"{sizes['dense_bytes_after'] / 1e6:.2f} MB")
    print(f"{'; '.join(parts)}; wrote {out}")


def _precision(policy: Optional[str], table: Optional[str], loads: Optional[str], spec):
    """The experts' PrecisionTable from --table or --policy (with --loads for hot=F)."""
    from pathlib import Path

    from moetune.errors import UsageError
    from moetune.quant.table import hot_fraction, parse_policy, read_table, uniform

    layers, E = list(spec.moe_layers), spec.moe.num_experts
    if table is not None:
        return read_table(Path(table), layers, E)
    chosen = parse_policy(policy)
    if "experts" in chosen:
        return uniform(chosen["experts"], layers, E)
    if loads is None:
        raise UsageError(f"--policy {policy} ranks experts by load: give --loads RUN_DIR (moetune profile --out)")
    from moetune.quant.loads import read_expert_loads

    return hot_fraction(read_expert_loads(loads, layers, E), layers, chosen["hot_fraction"],
                        chosen["high"], chosen["low"])
