"""`moetune search` end to end: set up, run the study, re-measure the top trials (this machine),
emit the winner (recipe, flags, SGLang JSON), the CSVs and the report."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from moetune.errors import MoetuneError
from moetune.search.study.engine_server import EngineChoice
from moetune.search.study.engine_formats import gpu_space
from moetune.search.study.engine_report import measured_first
from moetune.search.study.evaluate import Evaluator, MeasureEvaluator, SimulateEvaluator
from moetune.search.cost.metrics import Metrics
from moetune.search.cost.precision import dense_knob
from moetune.search.cost.slo_load import DEFAULT_CONCURRENCY
from moetune.search.cost.warm import warm
from moetune.search.study.resume import study_inputs
from moetune.search.study.seeds import reference_seeds
from moetune.search.study.setup import Inputs, Setup, prepare
from moetune.search.study.machine_space import machine_space
from moetune.search.study.space import build_space, canonical, from_config, named_values, read_space_file
from moetune.search.study.optuna_study import StudySettings, TrialRow, pareto, ranked, rows, run_study

EVALUATORS = ("simulate", "measure", "engine")


@dataclass(frozen=True)
class SearchSettings:
    inputs: Inputs
    study: StudySettings
    out: Path
    evaluator: str = "simulate"
    space_file: str | None = None
    what_if: bool = False
    remeasure: int = 0  # top N re-measured on this machine after a simulated search
    prompts: str | None = None  # the measure evaluator's prompts (default: the profile's bundled ones)
    hf_id: str | None = None  # the model id the emitted vLLM/SGLang commands load
    quality: bool = False  # measure each low-bit mix's KL / top-1 (quality.py); --max-kl asks for it too
    engine: EngineChoice | None = None  # --evaluator engine / --remeasure-on: which engine, how it is started
    remeasure_on: int = 0  # top K of a simulated search re-measured on `engine`


@dataclass
class SearchResult:
    out: Path
    rows: list[TrialRow]
    ranked: list[TrialRow]
    front: list[TrialRow]
    winner: TrialRow | None
    baseline: Metrics | None
    files: dict = field(default_factory=dict)
    remeasured: list = field(default_factory=list)
    calibrated_on: str = ""  # Setup.calibrated_on(): what the simulated figures were calibrated on


def make_evaluator(kind: str, setup: Setup, settings: SearchSettings) -> Evaluator:
    if kind == "simulate":
        sim = SimulateEvaluator(setup.sim, setup.workload)
        if settings.inputs.calibrate_on != "engine":
            return sim
        from moetune.search.study.engine_calibration import CorrectedEvaluator, fit

        correction = fit(settings.out / "engine", setup.hardware.name)
        setup.engine_correction = correction.label()
        return CorrectedEvaluator(sim, correction, setup.workload.output_len)
    if kind not in EVALUATORS:
        raise MoetuneError(f"--evaluator {kind!r} is not one of {', '.join(EVALUATORS)}")
    if kind == "engine":
        import functools

        from moetune.search.study.engine_eval import make_engine_evaluator

        if setup.source.scaled_from is not None:
            raise MoetuneError("--evaluator engine / --remeasure-on serve the trace's own model: drop --scale-model")
        if serve_device(setup) == "cuda" and setup.hardware.name != "this-machine" and not _has_cuda():
            raise MoetuneError(f"--evaluator engine / --remeasure-on run the engine here, and this machine has no GPU "
                               f"for --hardware {setup.hardware.name}: use --hardware this-machine")
        return make_engine_evaluator(settings.engine, setup.sim, setup.workload,
                                     functools.partial(serve_target, settings, setup), serve_device(setup),
                                     measured_prompts(setup, settings), settings.out / "engine")
    if setup.hardware.name != "this-machine" or setup.source.scaled_from is not None:
        raise MoetuneError("--evaluator measure runs here: use --hardware this-machine and no --scale-model")
    if setup.workload.mode != "burst":
        raise MoetuneError("--evaluator measure runs a burst (every request at once): drop --concurrency and "
                           "--request-rate, or use --evaluator simulate")
    return MeasureEvaluator(setup.base, setup.sim, setup.workload, measured_prompts(setup, settings),
                            settings.out / "placements")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def measured_prompts(setup: Setup, settings: SearchSettings) -> tuple:
    """The profile's prompts (else the bundled ones) as token ids at the workload's lengths."""
    from moetune.search.study.measure import request_prompts

    prompts_file = settings.prompts or setup.source.prompts
    if prompts_file and not Path(prompts_file).is_file():
        prompts_file = None  # the run was recorded elsewhere: the bundled prompts
    return request_prompts(setup.base, prompts_file, setup.workload)


def run_search(settings: SearchSettings, on_trial: Callable | None = None,
               evaluator: Evaluator | None = None) -> SearchResult:
    from moetune.search.study.optuna_study import check_settings

    check_settings(settings.study)
    setup = prepare(settings.inputs)
    if setup.workload.find_load:  # each trial's load is the highest meeting the SLOs: none meets → infeasible
        settings = replace(settings, study=replace(settings.study, constraints=replace(
            settings.study.constraints, slo_load=True)))
    m = setup.source.model
    overrides = read_space_file(settings.space_file) if settings.space_file else None
    here = setup.hardware.name == "this-machine"
    dense = (overrides or {}).pop("dense_format", None) if here else None  # this machine's own (machine_space.py)
    cluster = settings.evaluator == "simulate" and not here  # replicas: priced there
    par = setup.base.parallel
    space = build_space(m.E, setup.hardware.max_ranks, settings.what_if, overrides, cluster,
                        {"tp_size": par.tp_size, "expert_tp_size": par.expert_tp, **named_values(setup.base)})
    if cluster:  # the engines run no per-expert mixed formats (engine_formats.py)
        space = gpu_space(space, set(overrides or {}), setup.sim)
    if here:
        stored = dense_knob(setup.base.quant.dense if setup.base.quant is not None else None)
        space = machine_space(space, kernel_backend(setup.base), "quant_low_format" in (overrides or {}), dense, stored)
    limits = setup.limits()
    evaluator = evaluator or make_evaluator(settings.evaluator, setup, settings)
    if settings.evaluator == "simulate":
        warm(setup.sim)  # the kernels and prefix counts every trial uses, loaded before the first (cost/warm.py)
    lookup = quality_lookup(settings, setup, space)
    if lookup is not None:
        from moetune.search.study.quality import QualityEvaluator

        evaluator = QualityEvaluator(evaluator, lookup)
    created = not settings.out.exists()
    settings.out.mkdir(parents=True, exist_ok=True)
    try:
        inputs = study_inputs(settings.inputs.trace, space.grid())
        seed_lim = replace(limits, requests=DEFAULT_CONCURRENCY) if setup.workload.find_load else limits  # the
        # load is found per trial: the seeds hold the default concurrency per replica in one decode batch
        seeds = reference_seeds(space, seed_lim, setup.hardware.ranks_per_node, evaluator.memory_rule(),
                                setup.workload.find_load) \
            if settings.study.reference_trials else None
        study = run_study(replace(settings.study, inputs=inputs), space, limits, evaluator, on_trial, seeds)
    except MoetuneError:
        if created:  # a storage or study mistake: leave nothing behind
            import shutil

            shutil.rmtree(settings.out, ignore_errors=True)
        raise
    return finish(settings, setup, study, evaluator, lookup or winner_quality(settings, setup, space, study))


def quality_lookup(settings: SearchSettings, setup: Setup, space, winner_only: bool = False):
    """The quality lookup of a search that asks for it (--quality or --max-kl) over a space with a low-bit
    format; None otherwise (each trial measures nothing). `winner_only`: the lookup `winner_quality` prices
    a winner below fp8 with, asked or not."""
    from moetune.search.study.quality import QualityLookup, has_low_bit

    asked = settings.quality or settings.study.constraints.max_kl is not None or winner_only
    if not asked or not has_low_bit(space):
        return None
    src = setup.source
    model = setup.base.model.model_dump() if src.scaled_from is None and setup.base.model.path == src.model_path \
        else {"path": src.model_path}
    from moetune.config import parse_config

    stand_in = setup.source.model.name if src.scaled_from is not None else None
    return QualityLookup(parse_config({"model": model}, source="search quality"), str(Path(src.run_dir).resolve()),
                         settings.out / "quality.json", kernel_backend(setup.base), stand_in=stand_in)


BELOW_FP8 = ("int8", "int4")  # expert formats whose quality the search measures for its winner by default


def winner_quality(settings: SearchSettings, setup: Setup, space, study):
    """Quality priced by default: when the winner's experts are in a format below fp8 and no trial measured
    its quality (neither --quality nor --max-kl), its KL / top-1 are measured now (moetune eval's function,
    cached in OUT/quality.json) and shown beside it (`with_quality`: its rows, trials.csv, the report).
    Returns the lookup, or None where nothing was measured."""
    best = ranked(study)
    if not best or best[0].deployment.quant_low_format not in BELOW_FP8:
        return None
    lookup = quality_lookup(settings, setup, space, winner_only=True)
    if lookup is None:
        return None
    lookup.quality(best[0].deployment)  # measured once, cached: `with_quality` reads it
    return lookup


def with_quality(lookup, rows: list[TrialRow]) -> list[TrialRow]:
    """Rows whose metrics lack KL / top-1 given them where the lookup's cache holds their mix (no measuring)."""
    from moetune.search.study.quality import read_cache

    if lookup is None:
        return rows
    cache = read_cache(lookup.path)
    for r in rows:
        d, m = r.deployment, r.metrics or {}
        detail = m.get("detail") or {}
        if "kl" in detail or d.quant_low_format == "none":
            continue
        entry = cache.get(lookup.key(d.quant_low_format, d.quant_hot_fraction))
        if entry is not None:
            r.metrics = {**m, "detail": {**detail, "kl": entry["kl"], "top1_agreement": entry["top1_agreement"]}}
    return rows


def finish(settings: SearchSettings, setup: Setup, study, evaluator: Evaluator, lookup=None) -> SearchResult:
    from moetune.report.table import Table
    from moetune.search.study.emit import write_csv, write_winner
    from moetune.search.study.quality import quality_label
    from moetune.search.study.report import render, write_report
    from moetune.search.study.tables import remeasure_table

    all_rows, best, front = (with_quality(lookup, r) for r in (rows(study), ranked(study), pareto(study)))
    objectives = settings.study.objectives
    out = settings.out
    write_csv(all_rows, out / "trials.csv", objectives)
    write_csv(front, out / "pareto.csv", objectives)
    result = SearchResult(out, all_rows, best, front, best[0] if best else None, None, calibrated_on=setup.calibrated_on())
    if not best:
        return result
    extra = [Table("What the figures are calibrated on", ["calibration"], [[result.calibrated_on]])]
    if lookup is not None:
        from moetune.search.study.tables import quality_table

        extra.append(quality_table(lookup))
    if settings.remeasure and settings.evaluator == "simulate" and setup.hardware.name == "this-machine":
        result.remeasured = remeasure(setup, settings, best, settings.remeasure)
        extra.append(remeasure_table(result.remeasured))
    engine_pairs = []
    if settings.remeasure_on and settings.evaluator == "simulate":
        engine_pairs = remeasure(setup, settings, best, settings.remeasure_on, "engine")
        result.remeasured += engine_pairs
        best = result.ranked = measured_first(best, engine_pairs, objectives)  # measured values where they exist
        result.winner = best[0]
    winner = best[0]
    base_d = baseline(setup, evaluator)
    result.baseline = baseline_metrics(setup, evaluator, base_d, all_rows)
    how = f"{evaluator.name}, {setup.hardware.name}, study '{settings.study.study}' trial {winner.number}"
    chosen, _ = canonical(winner.deployment, setup.limits())  # the point as run: moot knobs at their twin's values
    result.files = write_winner(out, winner_base(settings, setup), chosen, winner.metrics, how, setup.source.model,
                                setup.source.loads, serve_target(settings, setup, chosen),
                                engine_price(settings, setup, evaluator), setup.source.run_dir,
                                settings.inputs.engine or "vllm")
    title = f"moetune search: {setup.source.model.name} on {setup.hardware.name} ({evaluator.name})"
    win = Metrics(**winner.metrics)
    figures = engine_outputs(settings, all_rows, engine_pairs, winner, result.files, extra)
    md, html, png = render(title, all_rows, best, front, objectives, study, win, result.baseline, extra,
                           (chosen.label(), canonical(base_d, setup.limits())[0].label()),
                           _estimated_phases(setup, win, chosen, base_d), quality_label(lookup), figures)
    for name, data in figures:
        (out / name).write_bytes(data)
        result.files[name.replace(".", "_")] = out / name
    for path in write_report(out, md, html, png):
        result.files["report_" + path.suffix.lstrip(".")] = path
    result.files.update(trials_csv=out / "trials.csv", pareto_csv=out / "pareto.csv")
    return result


def kernel_backend(base) -> str:
    """The kernel backend a recipe runs on here (`auto`: triton with CUDA, else cpu)."""
    name = base.model.kernel_backend
    if name != "auto":
        return name
    import torch

    device = base.model.device
    return "triton" if (device == "cuda" or (device == "auto" and torch.cuda.is_available())) else "cpu"


def winner_base(settings: SearchSettings, setup: Setup):
    """The recipe the winner is written on: the base recipe, and for a scaled model the model as
    priced — its identity (--hf-id, else the scale config), the hardware's precision and its GPUs
    per node."""
    if setup.source.scaled_from is None:
        return setup.base
    from moetune.config import parse_config

    data = setup.base.model_dump()
    data["model"]["path"] = settings.hf_id or str(Path(settings.inputs.scale_model).resolve())
    data["model"]["dtype"] = "bf16" if setup.hardware.act_bytes == 2 else "fp32"
    data["parallel"]["ranks_per_node"] = setup.hardware.ranks_per_node
    if setup.source.model.weight_format == "fp8":  # the checkpoint's own fp8 experts, as priced (simulate.py stored)
        data["quant"] = {"experts": "fp8"}
    return parse_config(data, source="search winner")


def serve_target(settings: SearchSettings, setup: Setup, winner=None):
    """What the emitted engine launches serve: --hf-id, else this run's own checkpoint directory (not
    for a scaled model), else the $MODEL_DIR placeholder; the winner's speculation (its `speculative`
    knob, the base recipe's without a winner)."""
    from moetune.search.study.launch import ServeTarget

    m, src = setup.source.model, setup.source
    model_id = settings.hf_id
    if model_id is None and src.scaled_from is None:  # model.path null: the bundled default model
        from moetune.model.registry import resolve_model

        from moetune.search.study.launch_env import served_model_dir

        model_id = served_model_dir(str(resolve_model(src.model_path)), settings.out)
    spec = setup.base.engine.speculative if winner is None else (
        None if winner.speculative == "none" else winner.speculative)
    return ServeTarget(model_id or "$MODEL_DIR", m.model_type, m.expert_groups, setup.hardware.ranks_per_node,
                       setup.hardware.name, served_speculative(spec, src.scaled_from), serve_device(setup))


def serve_device(setup: Setup) -> str:
    """Where the emitted launches run: "cpu" for this machine without a GPU, else "cuda"."""
    if setup.hardware.name != "this-machine" or setup.source.scaled_from is not None:
        return "cuda"
    return "cuda" if kernel_backend(setup.base) == "triton" else "cpu"


def served_speculative(text: str | None, scaled_from):
    """The recipe's engine.speculative as the engines serve it: a draft model's directory resolved
    (absolute), or the $DRAFT_DIR placeholder for a scaled model (the recipe's draft fits the run's
    own model, not the one served) or a draft this machine does not have."""
    if text is None:
        return None
    from dataclasses import replace

    from moetune.config import parse_speculative
    from moetune.errors import CheckpointError
    from moetune.model.registry import resolve_model
    from moetune.search.study.speculative_launch import DRAFT_PLACEHOLDER

    spec = parse_speculative(text)
    if spec.method != "draft":
        return spec
    try:
        path = DRAFT_PLACEHOLDER if scaled_from is not None else str(resolve_model(spec.path).resolve())
    except CheckpointError:
        path = DRAFT_PLACEHOLDER
    return replace(spec, path=path)


def engine_price(settings: SearchSettings, setup: Setup, evaluator: Evaluator):
    """The figures of a deployment as a serving engine runs it (the winner without the knobs that
    engine has no flag for): simulated searches re-price it; a measured search does not."""
    from dataclasses import asdict

    from moetune.search.study.space import prune

    def price(d) -> dict | None:
        if settings.evaluator != "simulate":
            return None
        why = prune(d, setup.limits()) or evaluator.check(d)
        return {"reason": why} if why else asdict(evaluator.evaluate(d))

    return price


def _estimated_phases(setup: Setup, win: Metrics, chosen, base_d):
    """A measured search's trials record no phases: the cost model's estimate of the winner and the baseline
    (labelled estimated) fills the per-phase comparison. None when the winner has its own phases."""
    if win.phases_ms:
        return None
    from moetune.errors import MoetuneError

    try:
        return setup.sim.evaluate(chosen), setup.sim.evaluate(base_d)
    except MoetuneError:  # an estimate that cannot be made (a recipe the model cannot price) leaves it empty
        return None


def baseline(setup: Setup, evaluator: Evaluator):
    """The base recipe's deployment; when it cannot run there (a large model on one GPU), the same
    with the fewest expert-parallel ranks that fit."""
    from dataclasses import replace

    from moetune.search.study.space import prune

    lim = setup.limits()
    d = from_config(setup.base)
    for r in [d.ep_size] + [r for r in range(1, setup.hardware.max_ranks + 1) if r != d.ep_size]:
        cand = replace(d, ep_size=r, redundant_experts=0 if r == 1 else d.redundant_experts,
                       placement=d.placement if r > 1 else "contiguous")
        if prune(cand, lim) is None and evaluator.check(cand) is None:
            return cand
    return d


def baseline_metrics(setup: Setup, evaluator: Evaluator, base_d, all_rows: list) -> Metrics | None:
    """The baseline's figures: evaluated like the trials; on an engine, a trial of the same deployment's
    measurement, else its estimate (an engine start per report is minutes); None when it cannot run."""
    try:
        if not evaluator.name.startswith("engine"):
            return evaluator.evaluate(base_d)
        key = canonical(base_d, setup.limits())[0]
        same = [r for r in all_rows if r.state == "COMPLETE" and r.metrics and r.deployment == key]
        return Metrics(**same[0].metrics) if same else SimulateEvaluator(setup.sim, setup.workload).evaluate(base_d)
    except Exception:  # the baseline may not run; the report says so
        return None


def engine_outputs(settings: SearchSettings, all_rows: list, pairs: list, winner: TrialRow, files: dict,
                   extra: list) -> list[tuple[str, bytes]]:
    """The estimate-beside-measurement table and plot, and the winner's launch-file check, when trials were
    measured on an engine (extra gets the tables); → the report's extra figures as (file name, PNG)."""
    from moetune.search.study.engine_report import estimate_png, estimate_table, launch_identity, pairs_of

    found = pairs_of(all_rows if settings.evaluator == "engine" else [], pairs)
    if not found:
        return []
    where = settings.engine.engine if settings.engine else "the engine"
    extra.insert(0, estimate_table(found, where))
    same = launch_identity(winner, files)
    if same is not None:
        extra.insert(1, same)
    png = estimate_png(found, where)
    return [("estimate_vs_measured.png", png)] if png else []


def runnable_top(ranked: list[TrialRow], k: int, check) -> tuple[list[TrialRow], list[tuple[TrialRow, str]]]:
    """The first k rows of `ranked` that `check` (deployment → why not, or None) passes, and the rows ranked
    above the last of them that it refused, each with why."""
    take, refused = [], []
    for row in ranked:
        if len(take) == k:
            break
        why = check(row.deployment)
        if why:
            refused.append((row, why))
        else:
            take.append(row)
    return take, refused


def remeasure(setup: Setup, settings: SearchSettings, ranked: list[TrialRow], k: int, kind: str = "measure") -> list:
    """(row, measured Metrics or None, why not) of the best k of `ranked` that can run here (`measure`) or on the
    engine; a better-ranked trial that cannot is listed with its reason (at most k of them, the count of the
    rest in the last one's reason), not measured."""
    evaluator = make_evaluator(kind, setup, settings)
    take, refused = runnable_top(ranked, k, evaluator.check)
    out = [(row, None, f"not run: {why}") for row, why in refused[:k]]
    if len(refused) > k:
        row, _, why = out[-1]
        out[-1] = (row, None, f"{why} (and {len(refused) - k} more better-ranked trials not run)")
    for row in take:
        try:
            out.append((row, evaluator.evaluate(row.deployment), None))
        except Exception as exc:  # a failed re-measure is a row of the table, not the end of the report
            out.append((row, None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
    return out
