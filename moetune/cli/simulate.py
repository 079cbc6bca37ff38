"""`moetune simulate`: one recipe's estimate on a hardware description, phase by phase, from a run's trace."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import OutputFormatOpt, TraceArgs, flag, trace_options


@trace_options("Recipe YAML (default: the run's model, default settings).")
def simulate(
    serve: bool = flag(False, "--serve", help="Price the recipe's engine knobs with all requests at once "
                                                      "(default: batches as `moetune profile` runs them)."),
    low_format: Optional[str] = typer.Option(None, "--quant-low-format", help="What-if: none | fp8 | int8 | int4."),
    hot_fraction: Optional[float] = typer.Option(None, "--quant-hot-fraction", help="What-if: experts kept full."),
    resident: Optional[float] = typer.Option(None, "--offload-resident-fraction", help="What-if: slots resident."),
    prefetch: Optional[int] = typer.Option(None, "--offload-prefetch-depth", help="What-if: layers prefetched ahead."),
    eviction: Optional[str] = typer.Option(None, "--offload-eviction", help="What-if: lru | lfu."),
    explain: bool = flag(False, "--explain", help="Also print the cost model's terms per step kind and "
                                                          "phase (FLOPs, bytes, calls, multipliers)."),
    fmt: str = OutputFormatOpt,
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write every figure of the tables as one "
                                           "JSON object to this file ('-' = stdout only, as JSON)."),
    w: TraceArgs = TraceArgs(""),
) -> None:
    """Estimate one deployment from a routing trace (every figure is an estimate)."""
    from moetune.report.terminal import Printer
    from moetune.search.cost.balance import balance_sentence
    from moetune.search.cost.describe import describe
    from moetune.search.study.one import simulate_recipe
    from moetune.search.study.tables import metrics_table, phase_table

    printer = Printer(fmt)
    if low_format is not None and low_format not in ("none", "fp8", "int8", "int4"):
        from moetune.errors import UsageError

        raise UsageError(f"--quant-low-format {low_format!r} is not one of none, fp8, int8, int4")
    if json_out not in (None, "-"):  # a mistake answered before the trace loads
        from pathlib import Path

        from moetune.cli import checks

        checks.output_file("--json", Path(json_out))
    what_if = {"quant_low_format": low_format, "quant_hot_fraction": hot_fraction,
               "offload_resident_fraction": resident, "offload_prefetch_depth": prefetch, "offload_eviction": eviction}
    from moetune.cli.progress import progress

    with progress("simulate") as bar:
        bar.phase("reading the trace and calibrating")

        started = []  # the vectorised pricing reports once, with every step done

        def on_step(done: int, total) -> None:
            if not started:
                started.append(True)
                bar.phase("pricing lock-steps", total=total)
            bar.update(done=done)

        setup, d, m = simulate_recipe(w.inputs(), as_profile=not serve, what_if=what_if, explain=explain,
                                      on_step=on_step)
    if json_out is not None:  # one object: the deployment, the hardware and every figure (Metrics), all estimated
        import json
        from pathlib import Path

        text = json.dumps({"model": setup.source.model.name, "hardware": setup.hardware.name,
                           "deployment": d.as_dict(), "label": d.label(), "not_priced": list(setup.not_priced),
                           **m.as_dict()}, default=float)
        if json_out == "-":
            print(text)
            return
        Path(json_out).write_text(text + "\n")
    printer.line(f"{setup.source.model.name} on {setup.hardware.name} ({setup.hardware.max_ranks} ranks available): "
                 f"{describe(d)}, {m.workload} — all figures estimated")
    printer.line(setup.calibrated_on())
    if setup.not_priced:
        printer.line(f"NOT as priced: {', '.join(setup.not_priced)} — the trace cannot replay them (the same keys "
                     "search's simulate evaluator refuses); measure them with moetune bench or search --evaluator measure")
    printer.table(phase_table("Phases per step kind (estimated)", m))
    printer.table(metrics_table("Totals (estimated)", m))
    printer.line(balance_sentence(m))
    if "cost_source" in m.detail:
        from moetune.search.cost.op_tables import cost_sentence

        printer.line(cost_sentence(m.detail))
    if explain:
        from moetune.search.cost.explain import terms_table

        cal = setup.calibration
        path = {k: cal.path_factor(k, d.ep_size) for k in ("prefill", "decode")} if cal else {}
        printer.table(terms_table(setup.sim.terms or {}, setup.sim.hw, path))
