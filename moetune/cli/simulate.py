"""`moetune simulate`: one recipe's estimate on a hardware description, phase by phase, from a run's trace."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import (ArrivalSeedOpt, CalibrateOnOpt, ConcurrencyOpt, RateOpt, RecalibrateOpt, SloTpotOpt,
                                  SloTtftOpt, WarmupOpt)


def simulate(
    trace: str = typer.Option(..., "--trace", "-t", help="Run directory of `moetune profile` (its routing trace)."),
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Recipe YAML (default: the run's model, "
                                                                      "default settings)."),
    hardware: str = typer.Option("this-machine", "--hardware", help="H100 | H200 | B200 | NxH200 | this-machine "
                                                                    "| a YAML file."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes of the hardware (default: 1, or from NxGPU)."),
    scale_model: Optional[str] = typer.Option(None, "--scale-model", help="config.json of a larger model to "
                                                                          "replay the routing on."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", help="Requests (default: the run's)."),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="Prompt tokens (default: the run's)."),
    output_len: Optional[int] = typer.Option(None, "--output-len", help="Output tokens (default: the run's)."),
    serve: bool = typer.Option(False, "--serve", help="Price the recipe's engine knobs with all requests at once "
                                                      "(default: batches as `moetune profile` runs them)."),
    concurrency: Optional[int] = ConcurrencyOpt,
    request_rate: Optional[float] = RateOpt,
    warmup_requests: Optional[int] = WarmupOpt,
    arrival_seed: int = ArrivalSeedOpt,
    slo_ttft_ms: Optional[float] = SloTtftOpt,
    slo_tpot_ms: Optional[float] = SloTpotOpt,
    low_format: Optional[str] = typer.Option(None, "--quant-low-format", help="What-if: none | fp8 | int8 | int4."),
    hot_fraction: Optional[float] = typer.Option(None, "--quant-hot-fraction", help="What-if: experts kept full."),
    resident: Optional[float] = typer.Option(None, "--offload-resident-fraction", help="What-if: slots resident."),
    prefetch: Optional[int] = typer.Option(None, "--offload-prefetch-depth", help="What-if: layers prefetched ahead."),
    eviction: Optional[str] = typer.Option(None, "--offload-eviction", help="What-if: lru | lfu."),
    calibrate_on: str = CalibrateOnOpt,
    recalibrate: bool = RecalibrateOpt,
    explain: bool = typer.Option(False, "--explain", help="Also print the cost model's terms per step kind and "
                                                          "phase (FLOPs, bytes, calls, multipliers)."),
) -> None:
    """Estimate one deployment from a routing trace (every figure is an estimate)."""
    from rich.console import Console

    from moetune.report.terminal import rich_table
    from moetune.search.study.one import simulate_recipe
    from moetune.search.study.setup import Inputs
    from moetune.search.study.tables import metrics_table, phase_table

    if low_format is not None and low_format not in ("none", "fp8", "int8", "int4"):
        from moetune.errors import UsageError

        raise UsageError(f"--quant-low-format {low_format!r} is not one of none, fp8, int8, int4")
    what_if = {"quant_low_format": low_format, "quant_hot_fraction": hot_fraction,
               "offload_resident_fraction": resident, "offload_prefetch_depth": prefetch, "offload_eviction": eviction}
    inp = Inputs(trace, hardware, nodes, recipe, scale_model, num_requests, input_len, output_len, calibrate_on,
                 recalibrate, concurrency, request_rate, warmup_requests, arrival_seed, slo_ttft_ms, slo_tpot_ms)
    setup, d, m = simulate_recipe(inp, as_profile=not serve, what_if=what_if, explain=explain)
    console = Console()
    console.print(f"[bold]{setup.source.model.name}[/] on {setup.hardware.name} "
                  f"({setup.hardware.max_ranks} ranks available): {d.label()}, {m.workload} — all figures estimated")
    console.print(setup.calibrated_on(), highlight=False)
    console.print(rich_table(phase_table("Phases per step kind (estimated)", m)))
    console.print(rich_table(metrics_table("Totals (estimated)", m)))
    if explain:
        from moetune.search.cost.explain import terms_table

        cal = setup.calibration
        path = {k: cal.path_factor(k, d.ep_size) for k in ("prefill", "decode")} if cal else {}
        wide = Console(width=max(console.width, 150))  # eleven columns: not squeezed into a pipe's 80
        wide.print(rich_table(terms_table(setup.sim.terms or {}, setup.sim.hw, path)))

