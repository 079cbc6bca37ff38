"""`moetune bench`: prefill and decode tokens/s, optionally against transformers on the same weights."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import ModelArgs, OutputFormatOpt, model_options


@model_options("ep", "tp", "spec")
def bench(
    against: Optional[str] = typer.Option(None, "--against", help="Also run 'transformers' on the same weights "
                                          "(both loaded; each workload's runs take turns with the reference's)."),
    prefill_len: int = typer.Option(512, "--prefill-len", min=1),
    decode_steps: int = typer.Option(32, "--decode-steps", min=1),
    runs: int = typer.Option(3, "--runs", min=3, help="Timed runs per workload (median reported)."),
    fmt: str = OutputFormatOpt,
    m: ModelArgs = ModelArgs(),
) -> None:
    """Prefill tokens/s (batch 1) and decode tokens/s (batch 1 and 16): medians after a warm-up, with the
    achieved GB/s (decode) and GFLOP/s (prefill) against the machine's limits measured in the same run."""
    from moetune.cli.options import apply_threads
    from moetune.engine.target import resolve_target
    from moetune.errors import MoetuneError
    from moetune.report.terminal import Printer

    printer = Printer(fmt)
    if against not in (None, "transformers"):
        raise MoetuneError(f"--against '{against}' is not supported; the only reference is 'transformers'")
    cfg = m.checked()
    target = resolve_target(cfg)  # once: the checkpoint checked, the placement, device and dtype
    settings = _settings(prefill_len, decode_steps, runs, cfg.engine.speculative)
    _check_fits(target, settings, reference=against is not None)
    if cfg.parallel.world > 1:
        if against:
            raise MoetuneError("--against runs transformers on one process; drop it or use --ep-size 1 --tp-size 1")
        if settings.speculative:
            raise MoetuneError("bench --speculative runs on one process (the ranks' bench decodes plainly); "
                               "drop it or use --ep-size 1")
        return _print_ranks(cfg, settings, printer)
    from moetune.report.bench import bench_table, limits_lines

    apply_threads(cfg)
    result = _run(target, settings, against)
    printer.table(bench_table(result.rows, result.title, result.limits))
    printer.line(result.precision)
    for line in limits_lines(result.limits):
        printer.line(line)


def _run(target, settings, against):
    """run_bench with progress on stderr: its phases, then workload i of n."""
    import contextlib

    from moetune.bench.run import run_bench
    from moetune.cli.progress import progress

    with progress("bench") as bar:
        def status(what: str):
            bar.phase(what.rstrip(" ."))
            return contextlib.nullcontext()

        def on_workload(done: int, total: int) -> None:
            if done == 0:
                bar.phase("workloads", total=total)
            bar.update(done=done)

        bar.phase("loading model")
        return run_bench(target, settings, against, status=status, on_workload=on_workload)


def _settings(prefill_len: int, decode_steps: int, runs: int, speculative: str | None = None):
    from moetune.bench.throughput import BenchSettings  # imports torch; only after the argument checks

    return BenchSettings(prefill_len=prefill_len, decode_steps=decode_steps, runs=runs, speculative=speculative)


def _check_fits(target, s, reference: bool = False) -> None:
    """Every bench workload within the context and, by estimate, the device's memory (with a second
    copy of the weights when the reference runs beside ours: their runs take turns)."""
    from moetune.cli import checks
    from moetune.cli.footprint import target_parts

    limit = target.spec.max_position
    checks.context(f"--prefill-len {s.prefill_len}", s.prefill_len, limit, f"choose --prefill-len <= {limit}")
    decode_len = s.decode_context + s.decode_steps
    checks.context(f"--decode-steps {s.decode_steps} (after a {s.decode_context}-token context)", decode_len, limit,
                   f"choose --decode-steps <= {limit - s.decode_context}")
    prefill = target_parts(target, 1, s.prefill_len, s.prefill_len, s.prefill_len)
    b = max(s.decode_batches)
    decode = target_parts(target, b, decode_len, b * s.decode_context, s.decode_context)
    worst, what = max((prefill, f"--prefill-len {s.prefill_len}"), (decode, f"decode at batch {b}"),
                      key=lambda p: sum(p[0].values()))
    if reference:
        worst = {**worst, "the reference's weights": worst["weights"]}
    checks.fits(f"bench {what}", worst, target.device, "lower --prefill-len / --decode-steps")


def _print_ranks(cfg, settings, printer) -> None:
    from moetune.bench.run import run_bench_ranks
    from moetune.report.table import Table

    rows = run_bench_ranks(cfg, settings)
    if rows is None:  # a rank other than 0 under torchrun: rank 0 prints
        return
    cols = ["workload", "tok/s (min–max)", "all-to-all share", "of which waiting", "bytes/step", "TP share"]
    out = []
    for r in rows:
        lo, hi = r.tokens / r.timing.max_s, r.tokens / r.timing.min_s
        out.append([r.workload, f"{r.tokens_per_s:,.1f} ({lo:,.0f}–{hi:,.0f})", f"{r.a2a_share:.1%}",
                    f"{r.wait_share:.1%}", f"{r.bytes_per_step:,.0f}", f"{r.tp_share:.1%}"])
    printer.table(Table(f"{cfg.parallel.ep_size} expert-parallel ranks (data-parallel attention) × "
                        f"{cfg.parallel.group_size} tensor-parallel · rank 0's view", cols, out,
                        align_right=[c != "workload" for c in cols]))
