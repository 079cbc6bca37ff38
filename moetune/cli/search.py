"""`moetune search`: an Optuna study over the deployment knobs; the winner emitted as a recipe."""

from __future__ import annotations

from typing import Optional, Tuple

import typer

from moetune.cli.options import OutputFormatOpt, ReferenceTrialsOpt, TraceArgs, flag, trace_options


@trace_options("Base recipe (default: the run's model).")
def search(
    evaluator: str = typer.Option("simulate", "--evaluator", help="simulate (cost model) | measure (run here) | "
                                  "engine (each trial's launch file run on --engine, measured with bench-serve)."),
    engine_cmd: Optional[str] = typer.Option(None, "--engine-cmd", help="The engine's executable (default: vllm on "
                                             "PATH; for sglang, a python with SGLang installed)."),
    engine_port: int = typer.Option(0, "--engine-port", help="Port the engine serves on (default: a free one per "
                                                            "trial)."),
    engine_timeout_s: float = typer.Option(900.0, "--engine-timeout-s", help="Seconds the engine may take to "
                                                                             "become healthy."),
    remeasure_on: Optional[Tuple[str, int]] = typer.Option(None, "--remeasure-on", metavar="ENGINE K",
                                                 help="After a simulated search, measure the best K trials ENGINE "
                                                      "(vllm | sglang) can run, estimate beside measurement; the "
                                                      "ranking then puts measured values first."),
    study: str = typer.Option("moetune-search", "--study", help="Study name; the same name continues the study."),
    storage: Optional[str] = typer.Option(None, "--storage", help="RDB URL (default: sqlite:///OUT/study.db; "
                                                                  "postgresql://... for several workers)."),
    sampler: Optional[str] = typer.Option(None, "--sampler", help="tpe | nsga2 | grid | random (default: tpe, "
                                                                  "nsga2 with two objectives)."),
    objective: str = typer.Option("throughput", "--objective", help="Comma-separated: throughput, "
                                                                    "throughput_per_rank, throughput_per_gpu, tpot, ttft, memory, "
                                                                    "goodput (needs --slo-ttft-ms and --slo-tpot-ms)."),
    n_trials: Optional[int] = typer.Option(None, "--n-trials", help="Trials in the study in total (all workers; "
                                           "default: 100 simulated, about a second each; 40 measured)."),
    reference_trials: bool = ReferenceTrialsOpt,
    seed: Optional[int] = typer.Option(0, "--seed", help="Sampler seed."),
    space: Optional[str] = typer.Option(None, "--space", help="YAML: knob → value or list (narrow or fix)."),
    what_if: bool = flag(False, "--what-if", help="Also search knobs a recipe cannot say yet "
                                 "(simulate only; none at present: every knob is a recipe key)."),
    max_mem_gb: Optional[float] = typer.Option(None, "--max-mem-gb", help="Constraint: peak GB per rank."),
    max_ttft_ms: Optional[float] = typer.Option(None, "--max-ttft-ms", help="Constraint: median TTFT (ms); on GPU "
                                           "hardware also the SLO the load is found by (unless --slo-ttft-ms)."),
    max_tpot_ms: Optional[float] = typer.Option(None, "--max-tpot-ms", help="Constraint: median TPOT (ms); on GPU "
                                           "hardware also the SLO the load is found by (unless --slo-tpot-ms)."),
    max_low_share: Optional[float] = typer.Option(None, "--max-low-share", help="Constraint (quality stand-in): "
                                                                                "share of copies on low-bit experts."),
    max_kl: Optional[float] = typer.Option(None, "--max-kl", help="Constraint: KL (nats) of the low-bit expert mix "
                                           "vs full precision, measured by moetune eval on the trace's model "
                                           "(once per format × hot fraction, cached in OUT/quality.json)."),
    max_dropped_fraction: Optional[float] = typer.Option(None, "--max-dropped-fraction", help="Constraint: share "
                                                         "of expert copies a capacity_policy drop drops (0..1; "
                                                         "simulated or measured)."),
    quality: bool = flag(False, "--quality", help="Measure each low-bit mix's KL / top-1 (as --max-kl does) "
                         "without a limit: columns in trials.csv and the report."),
    grace_s: int = typer.Option(6, "--grace-s", help="Seconds a worker may stay silent before its running trial is "
                                                    "failed and re-queued (after a crash)."),
    remeasure: int = typer.Option(0, "--remeasure", help="Re-measure the best N trials that run here after a "
                                                        "simulated search."),
    allow_changed_inputs: bool = flag(False, "--allow-changed-inputs", help="Continue a study under another "
                                              "--trace or --space (refused by default: its trials would mix)."),
    out: str = typer.Option("search-out", "--out", "-o", help="Directory for the winner, CSVs and report."),
    hf_id: Optional[str] = typer.Option(None, "--hf-id", help="Model id the emitted vLLM/SGLang commands load "
                                        "(default: the run's checkpoint; $MODEL_DIR for a scaled model)."),
    fmt: str = OutputFormatOpt,
    w: TraceArgs = TraceArgs(""),
) -> None:
    """Search EP size, replicas, placement and batching knobs for the best deployment; emit the winner."""
    from pathlib import Path

    from moetune.cli import checks
    from moetune.report.terminal import Printer
    from moetune.search.study.optuna_study import Constraints, StudySettings
    from moetune.search.study.run import SearchSettings

    printer = Printer(fmt)
    _check_numbers(max_mem_gb, max_ttft_ms, max_tpot_ms, max_low_share, max_kl, max_dropped_fraction, remeasure,
                   grace_s)
    choice = _engine_choice(evaluator, w.engine, engine_cmd, engine_port, engine_timeout_s, remeasure_on)
    out_dir = Path(out)
    checks.output_dir("--out", out_dir)
    objectives, w = _objectives(objective, w), _slo_limits(w, max_ttft_ms, max_tpot_ms)
    storage = storage or f"sqlite:///{out_dir.resolve() / 'study.db'}"
    n_trials = n_trials if n_trials is not None else (100 if evaluator == "simulate" else 40)
    study_settings = StudySettings(study, storage, objectives, sampler or ("nsga2" if len(objectives) > 1 else "tpe"),
                                   n_trials, seed, Constraints(max_mem_gb, max_ttft_ms, max_tpot_ms, max_low_share, max_kl,
                                                                   max_dropped_fraction),
                                   heartbeat_s=max(1, grace_s // 3), grace_s=grace_s,
                                   allow_changed_inputs=allow_changed_inputs, reference_trials=reference_trials)
    settings = SearchSettings(w.inputs(), study_settings, out_dir, evaluator, space, what_if, remeasure, hf_id=hf_id,
                              quality=quality, engine=choice, remeasure_on=remeasure_on[1] if remeasure_on else 0)
    _run(settings, printer)


def _check_numbers(max_mem_gb, max_ttft_ms, max_tpot_ms, max_low_share, max_kl, max_dropped_fraction, remeasure,
                   grace_s) -> None:
    from moetune.cli import checks

    for name, value in (("--max-mem-gb", max_mem_gb), ("--max-ttft-ms", max_ttft_ms),
                        ("--max-tpot-ms", max_tpot_ms), ("--max-low-share", max_low_share)):
        checks.number(name, value, 0, low_open=True)
    checks.number("--max-kl", max_kl, 0)
    checks.number("--max-dropped-fraction", max_dropped_fraction, 0, 1)
    checks.number("--remeasure", remeasure, 0)
    checks.number("--grace-s", grace_s, 2)


def _objectives(objective: str, w) -> tuple[str, ...]:
    objectives = tuple(o.strip() for o in objective.split(",") if o.strip())
    if "goodput" in objectives and (w.slo_ttft_ms is None or w.slo_tpot_ms is None):
        from moetune.errors import UsageError

        raise UsageError("--objective goodput counts requests meeting both SLOs: give --slo-ttft-ms and --slo-tpot-ms")
    return objectives


def _engine_choice(evaluator: str, engine, cmd, port: int, timeout_s: float, remeasure_on: tuple):
    """--engine and its options, or --remeasure-on ENGINE K, as one EngineChoice (None: no engine asked for)."""
    from moetune.cli import checks
    from moetune.errors import UsageError
    from moetune.search.study.engine_server import ENGINES, EngineChoice

    on, k = remeasure_on or (None, None)
    if on is not None:
        if on not in ENGINES:
            raise UsageError(f"--remeasure-on {on!r}: the engine is one of {', '.join(ENGINES)}")
        checks.number("--remeasure-on K", k, 1)
        if evaluator != "simulate":
            raise UsageError("--remeasure-on re-measures a simulated search's top trials: use --evaluator simulate")
        if engine is not None and engine != on:
            raise UsageError(f"--engine {engine} and --remeasure-on {on}: two engines; give one")
        engine = on
    if engine is not None and engine not in ENGINES:
        raise UsageError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if evaluator == "engine" and engine is None:
        raise UsageError("--evaluator engine needs --engine vllm | sglang")
    if engine is None:
        return None
    checks.number("--engine-port", port, 0, 65535)
    checks.number("--engine-timeout-s", timeout_s, 0, low_open=True)
    return EngineChoice(engine, cmd, port, timeout_s)


def _run(settings, printer) -> None:
    from moetune.cli.progress import progress
    from moetune.search.cost.metrics import OBJECTIVES
    from moetune.search.study.run import run_search
    from moetune.search.study.tables import trials_table, states_table

    objective = settings.study.objectives[0]
    best: dict = {}
    tag = "estimated" if settings.evaluator == "simulate" else "measured"
    if settings.evaluator == "engine":
        tag = f"measured on {settings.engine.engine}"
    with progress("search") as bar:
        bar.phase("trials", total=settings.study.n_trials)

        def on_trial(row, done: int) -> None:
            if row.state == "COMPLETE" and row.values and row.feasible:
                v = row.values[0]
                if not best or (v > best["v"]) == (OBJECTIVES[objective][1] == "maximize"):
                    best.update(v=v, label=row.deployment.label())
            text = f"best {objective} {best['v']:,.4g} ({tag}) {best['label']}" if best else "no feasible trial yet"
            bar.update(done=done, note=text)

        import warnings

        with warnings.catch_warnings():  # Optuna's experimental / deprecation notes are not the user's business
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            from optuna.exceptions import ExperimentalWarning

            warnings.simplefilter("ignore", ExperimentalWarning)
            result = run_search(settings, on_trial)
    printer.line(result.calibrated_on)
    printer.table(states_table(result.rows))
    if result.winner is None:
        printer.line("no feasible trial finished; see trials.csv for the reasons")
        return
    printer.table(trials_table(result.ranked, settings.study.objectives))
    from moetune.search.study.forms import form_sentence

    form = form_sentence(result.rows, settings.study.objectives[0])  # aggregated vs disaggregated, both tried
    if form:
        printer.line(form)
    if result.remeasured:
        from moetune.search.study.tables import remeasure_table

        where = settings.engine.engine if settings.remeasure_on and settings.engine else "this machine"
        printer.table(remeasure_table(result.remeasured, where))
    for name, path in result.files.items():
        printer.line(f"{name}: {path}")


def _slo_limits(w, max_ttft_ms, max_tpot_ms):
    """On GPU hardware --max-ttft-ms / --max-tpot-ms are also the SLOs the load is found by
    (search/cost/slo_load.py) where --slo-ttft-ms / --slo-tpot-ms are not given."""
    if w.hardware == "this-machine":
        return w
    from dataclasses import replace

    return replace(w, slo_ttft_ms=w.slo_ttft_ms if w.slo_ttft_ms is not None else max_ttft_ms,
                   slo_tpot_ms=w.slo_tpot_ms if w.slo_tpot_ms is not None else max_tpot_ms)
