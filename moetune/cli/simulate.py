"""`moetune simulate`: one recipe's estimate on a hardware description, phase by phase, from a run's trace."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import TraceArgs, flag, trace_options


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
    w: TraceArgs = TraceArgs(""),
) -> None:
    """Estimate one deployment from a routing trace (every figure is an estimate)."""
    from rich.console import Console

    from moetune.report.terminal import rich_table
    from moetune.search.cost.balance import balance_sentence
    from moetune.search.study.one import simulate_recipe
    from moetune.search.study.tables import metrics_table, phase_table

    if low_format is not None and low_format not in ("none", "fp8", "int8", "int4"):
        from moetune.errors import UsageError

        raise UsageError(f"--quant-low-format {low_format!r} is not one of none, fp8, int8, int4")
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
    console = Console()
    console.print(f"[bold]{setup.source.model.name}[/] on {setup.hardware.name} "
                  f"({setup.hardware.max_ranks} ranks available): {d.label()}, {m.workload} — all figures estimated")
    console.print(setup.calibrated_on(), highlight=False)
    if setup.not_priced:
        console.print(f"NOT as priced: {', '.join(setup.not_priced)} — the trace cannot replay them (the same "
                      "keys search's simulate evaluator refuses); measure them with moetune bench or "
                      "search --evaluator measure", highlight=False, soft_wrap=True)
    console.print(rich_table(phase_table("Phases per step kind (estimated)", m)))
    console.print(rich_table(metrics_table("Totals (estimated)", m)))
    console.print(balance_sentence(m), highlight=False, soft_wrap=True)
    if "cost_source" in m.detail:
        from moetune.search.cost.op_tables import cost_sentence

        console.print(cost_sentence(m.detail), highlight=False, soft_wrap=True, markup=False)
    if explain:
        from moetune.search.cost.explain import terms_table

        cal = setup.calibration
        path = {k: cal.path_factor(k, d.ep_size) for k in ("prefill", "decode")} if cal else {}
        wide = Console(width=max(console.width, 150))  # eleven columns: not squeezed into a pipe's 80
        wide.print(rich_table(terms_table(setup.sim.terms or {}, setup.sim.hw, path)))

