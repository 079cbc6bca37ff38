"""`moetune profile`: run a workload with phase probes attached; write a run dir; print the breakdown."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import ModelArgs, OutputFormatOpt, flag, model_options


@model_options("ep", "tp", "spec")
def profile(
    prompts: Optional[str] = typer.Option(None, "--prompts", help="JSONL with a 'prompt' field, or text: one per line "
                                                                  "(default: the bundled held-out prompts)."),
    num_requests: int = typer.Option(64, "--num-requests", help="Requests (prompts are cycled)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Requests per batch (one prefill + decodes each)."),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="Cut or pad every prompt to this many tokens."),
    output_len: int = typer.Option(64, "--output-len", help="Tokens generated per request (EOS ignored)."),
    warmup_steps: int = typer.Option(2, "--warmup-steps", help="Steps run first and excluded from all figures."),
    ranks_per_node: Optional[int] = typer.Option(None, "--ranks-per-node", help="Ranks per node (default: the recipe's; else ranks this command starts share one node, torchrun's LOCAL_WORLD_SIZE, a --what-if 1)."),
    what_if: bool = flag(False, "--what-if", help="Do not start R ranks: compute EP-R traffic "
                                                                       "from one process."),
    capacity_factor: Optional[float] = typer.Option(None, "--capacity-factor", help="Count drops over ceil(cf·T·K/E)."),
    trace: bool = flag(False, "--torch-trace", help="torch.profiler trace to RUN/tb (TensorBoard) and RUN/trace.json."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Run directory (default: runs/<model>-<timestamp>)."),
    report: bool = flag(False, "--report", help="Also write RUN/report.html and RUN/report.md."),
    overhead: bool = flag(False, "--overhead", help="Only measure probe overhead (probes on "
                                                                          "vs off)."),
    fmt: str = OutputFormatOpt,
    m: ModelArgs = ModelArgs(),
) -> None:
    """Profile a model phase by phase: times, routing skew, EP traffic, memory. Writes a run dir."""
    from dataclasses import replace
    from pathlib import Path

    from moetune.cli import checks
    from moetune.cli.options import apply_threads
    from moetune.profile.runner import ProfileSettings
    from moetune.profile.workload import Workload
    from moetune.report.terminal import Printer

    printer = Printer(fmt)
    workload = Workload(prompts, num_requests, batch_size, input_len, output_len, warmup_steps)
    workload.check()
    checks.number("--capacity-factor", capacity_factor, 0, low_open=True)
    cfg = m.checked(ep_size=None)  # R ranks are the profile's own: ProfileSettings
    settings = ProfileSettings(cfg, workload, m.ep_size, ranks_per_node, capacity_factor, trace,
                               Path(out) if out else None, what_if=what_if)
    if not overhead:
        checks.output_dir("--out", settings.out or settings.runs_root)
    settings = replace(settings, target=_preflight(settings))  # resolved once, here
    apply_threads(cfg)
    if overhead:
        return _overhead(settings, printer)
    _profile(settings, report, printer)


def _preflight(settings):
    """Prompts readable, the target resolved (checkpoint, a bad --ep-size, --placement or
    --redundant-experts), workload within the context and (by estimate) memory: before any loading."""
    from moetune.cli import checks
    from moetune.cli.footprint import profile_host_bytes, target_parts
    from moetune.engine.limits import context_words, max_len_of
    from moetune.engine.target import resolve_target
    from moetune.model.checkpoint import open_checkpoint
    from moetune.profile.session import parallel_sizes
    from moetune.profile.workload import load_prompt_texts, prompts_path

    w = settings.workload
    texts = load_prompt_texts(prompts_path(w))
    ep, rpn = parallel_sizes(settings)
    parallel = settings.config.parallel.model_copy(update={"ep_size": ep, "ranks_per_node": rpn})
    checkpoint = open_checkpoint(settings.config.model.path)  # no torch yet
    limit = max_len_of(settings.config.engine, checkpoint.spec.max_position)  # the engine's rule
    words = context_words(settings.config.engine, checkpoint.spec.max_position)
    if w.input_len is not None:
        checks.context(f"--input-len {w.input_len} + --output-len {w.output_len}", w.input_len + w.output_len,
                       limit, "lower --input-len or --output-len", words)
        prompt_len = w.input_len
    else:  # an upper bound before tokenizing: at most one token per byte, plus specials
        prompt_len = min(max(len(t.encode("utf-8")) + 2 for t in texts[: w.num_requests]), limit)
    target = resolve_target(settings.config.model_copy(update={"parallel": parallel}), checkpoint)
    if w.input_len is None and prompt_len + w.output_len > limit:  # the bound allows a prompt over the context
        _check_prompt_lengths(texts, w, checkpoint, limit, words)
    batch = w.real_batch_size
    max_len = min(prompt_len + w.output_len, limit)
    checks.fits(f"profile at batch {batch} (of --batch-size {w.batch_size}, --num-requests {w.num_requests})",
                target_parts(target, batch, max_len, batch * prompt_len, prompt_len), target.device,
                "lower --batch-size, --input-len or --output-len")
    host = profile_host_bytes(target.spec, w.num_requests, prompt_len + w.output_len, w.measured_steps())
    checks.fits(f"profile --num-requests {w.num_requests}", {"routing trace and tables": host}, None,
                "lower --num-requests or --output-len")
    return target


def _check_prompt_lengths(texts: list[str], w, checkpoint, max_len: int, words: str) -> None:
    """The requests tokenized as the run will tokenize them, refused by the run's own rule
    (profile/session.py's check_lengths) before any model loads or rank starts."""
    from moetune.engine.tokenizer import load_encoder
    from moetune.profile.session import check_lengths
    from moetune.profile.workload import request_tokens

    _, encode = load_encoder(checkpoint.model_dir, checkpoint.spec)
    check_lengths(request_tokens(texts, encode, w), w, max_len, words)


def _profile(settings, report: bool, printer) -> None:
    from moetune.cli.progress import progress
    from moetune.profile.runner import run_profile
    from moetune.report.ranks.tables import rank_tables
    from moetune.report.tables import (deployment_table, figure_tables, formulas_table, imbalance_table, phase_table,
                                       rates_table)

    with progress("profile") as bar:
        bar.phase("loading model")
        steps = {"done": 0, "total": 0}

        def on_start(n: int) -> None:
            steps["total"] = n
            bar.phase("steps", total=n)

        def on_step(kind: str) -> None:
            steps["done"] += 1
            bar.update(advance=1, note=kind)
            if steps["done"] == steps["total"]:  # the analysis and the run directory come after the last step
                bar.phase("analysing and writing the run directory")

        result = run_profile(settings, on_start=on_start, on_step=on_step)
    if result is None:  # a rank other than 0 under torchrun: rank 0 prints and writes
        return
    if report:
        _report(result.path)
    summary = result.summary
    from moetune.report.ranks.tp import tp_tables

    deployment = deployment_table(summary)  # offload hit rate, expert formats, capacity drops: when present
    for table in (*([deployment] if deployment else []), phase_table(summary), imbalance_table(summary),
                  *rank_tables(summary), *tp_tables(summary), *figure_tables(summary).values(), rates_table(summary),
                  formulas_table(summary)):
        printer.table(table)
    printer.line(f"run directory: {result.path}")


def _report(run_dir) -> None:
    """The reports, or (a full disk, an interrupt) no run directory at all: it is this command's."""
    import shutil

    from moetune.report.build import write_reports

    try:
        write_reports(run_dir, ["html", "md"])
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _overhead(settings, printer) -> None:
    from rich.console import Console

    from moetune.profile.overhead import measure_overhead
    from moetune.report.overhead import overhead_table

    with Console(stderr=True).status("measuring probes off / on ..."):
        result = measure_overhead(settings)
    printer.table(overhead_table(result))
