"""`moetune bench-serve`: load a running OpenAI-compatible server; print and write the figures."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import OutputFormatOpt


def bench_serve(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="Server base URL (without /v1)."),
    num_prompts: int = typer.Option(200, "--num-requests", "--num-prompts", help="Requests to send (--num-prompts: "
                                    "the same; vLLM's name)."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", help="Requests/s, Poisson arrivals "
                                                                              "(default: all at once)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Requests in flight at most."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="JSONL with a 'prompt' field, or text: one per "
                                                                  "line (default: the bundled held-out prompts)."),
    output_len: int = typer.Option(128, "--output-len", help="Tokens generated per request (EOS ignored)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Sent as 'Authorization: Bearer KEY'."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the server's first)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the arrival times."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="JSON result (default: runs/bench-serve-<time>.json)."),
    fmt: str = OutputFormatOpt,
) -> None:
    """Send a load to `moetune serve` (or any OpenAI-compatible server): throughput, TTFT/TPOT/ITL/latency."""
    import time
    from pathlib import Path

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from moetune.report.serve_load import load_table
    from moetune.report.terminal import Printer
    from moetune.bench.loadgen import LoadSettings, run_load, write_result
    from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

    printer = Printer(fmt)
    settings = LoadSettings(url, num_prompts, request_rate, concurrency, prompts, output_len, api_key=api_key,
                            model=model, seed=seed)
    settings.check()  # flag mistakes before the prompt file's
    texts = load_prompt_texts(prompts_path(Workload(prompts=prompts)))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("requests", total=num_prompts)
        result = run_load(settings, texts, on_done=lambda r: progress.update(task, advance=1))
    path = write_result(result, Path(out) if out else Path("runs") / f"bench-serve-{time.strftime('%Y%m%d-%H%M%S')}.json")
    printer.table(load_table(result))
    printer.line(f"result: {path}")
