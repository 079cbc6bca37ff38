"""The Optuna study: samplers, storage, budget across workers and restarts, pruning, failures,
constraints.

- Storage: an RDB URL (SQLite file by default; PostgreSQL for several workers on several
  machines). The same command with the same `--study` continues the study: `n_trials` is the
  study's total, not this process's.
- A worker that dies leaves its trial RUNNING; every worker beats a heartbeat, and a trial whose
  heartbeat stopped for `grace_s` is marked failed and re-queued with the same parameters
  (Optuna's `RetryFailedTrialCallback`), so no trial is lost; a finished trial is never run again
  (a re-suggested point reuses the finished trial's result, `reused_from`).
- Budget: a trial counts unless it is a stale trial that was re-queued or a surplus one; a trial
  whose rank among counted trials (by number) reaches `n_trials` is marked `surplus` and not run,
  so several workers finish exactly `n_trials` between them.
- Invalid points are pruned (state PRUNED, `pruned_reason`); a trial whose evaluator raises is
  FAIL with `fail_reason`, and the study goes on.
- Constraints (value − limit ≤ 0 is feasible) go to the samplers as Optuna constraints.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Callable

from moetune.errors import MoetuneError
from moetune.search.study.evaluate import Evaluator
from moetune.search.cost.metrics import OBJECTIVES, Metrics
from moetune.search.study.repair import fit_memory, repair
from moetune.search.study.space import NEUTRAL, Deployment, Limits, Space, canonical, prune

SAMPLERS = ("tpe", "nsga2", "grid", "random")


class SearchError(MoetuneError):
    """A search setting that cannot work (unknown sampler or objective, unreachable storage)."""


@dataclass(frozen=True)
class Constraints:
    max_mem_gb: float | None = None
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    max_low_share: float | None = None  # share of copies on low-bit experts (the cheap stand-in)
    max_kl: float | None = None  # KL of the expert mix vs full precision (quality.py: measured by moetune eval)
    max_dropped_fraction: float | None = None  # copies a capacity drops / all copies (simulated or measured)
    slo_load: bool = False  # the load is found per trial (cost/slo_load.py): infeasible where no load meets the SLOs

    def _limits(self, m: Metrics) -> list[tuple[str, float | None, float]]:
        """(flag, limit, the metrics' value) of each constraint."""
        return [("--max-mem-gb", self.max_mem_gb, m.peak_mem_gb), ("--max-ttft-ms", self.max_ttft_ms, m.ttft_ms),
                ("--max-tpot-ms", self.max_tpot_ms, m.tpot_ms),
                ("--max-low-share", self.max_low_share, m.detail.get("low_precision_share", 0.0)),
                ("--max-kl", self.max_kl, m.detail.get("kl", 0.0)),
                ("--max-dropped-fraction", self.max_dropped_fraction, m.detail.get("dropped_fraction", 0.0))]

    def values(self, m: Metrics) -> list[float]:
        return [float(value - limit) for _, limit, value in self._limits(m) if limit is not None] + \
            ([_load_value(m)] if self.slo_load else [])

    def violations(self, m: Metrics) -> list[str]:
        """Each limit the metrics break, in words: why a completed trial is not feasible."""
        load = (m.detail or {}).get("load") or {}
        return [f"{flag[6:].replace('-', '_')} {value:.4g} over {flag} {limit:g}"
                for flag, limit, value in self._limits(m) if limit is not None and value > limit] + \
            ([f"SLOs not met even at concurrency 1: {', '.join(load.get('missed') or [])}"]
             if load and not load.get("met", True) else [])

    def count(self) -> int:
        return sum(x is not None for x in (self.max_mem_gb, self.max_ttft_ms, self.max_tpot_ms, self.max_low_share,
                                           self.max_kl, self.max_dropped_fraction)) + int(self.slo_load)


def _load_value(m: Metrics) -> float:
    """The load search's constraint (cost/slo_load.py): −1 met at the load found, +1 not met even at
    concurrency 1."""
    load = (m.detail or {}).get("load") or {}
    return -1.0 if load.get("met", True) else 1.0


@dataclass(frozen=True)
class StudySettings:
    study: str
    storage: str
    objectives: tuple[str, ...] = ("throughput",)
    sampler: str = "tpe"
    n_trials: int = 50
    seed: int | None = 0
    constraints: Constraints = Constraints()
    heartbeat_s: int = 2
    grace_s: int = 6
    inputs: dict | None = None  # trace + space the trials depend on (resume.study_inputs); None: not checked
    allow_changed_inputs: bool = False
    reference_trials: bool = True  # a new study runs the reference deployments first (seeds.py; not the grid sampler)


@dataclass
class TrialRow:
    number: int
    state: str
    params: dict
    values: list | None
    metrics: dict | None
    reason: str | None = None
    feasible: bool = True
    canonical: dict | None = None  # the deployment the trial ran (its moot knobs at their twin's values)
    seeded: str | None = None  # the reference deployment (seeds.py) the study queued as this trial, or None
    twin: bool = False  # a twin of a point priced before: its result reused, no trial of the budget spent

    @property
    def deployment(self) -> Deployment:
        """What the trial ran and what a winner's recipe says: its canonical twin when it has one."""
        if self.canonical is not None:
            return Deployment(**{**Deployment().as_dict(), **self.canonical})
        return Deployment(**{**Deployment().as_dict(), **self.params})


def check_settings(s: StudySettings) -> None:
    if s.sampler not in SAMPLERS:
        raise SearchError(f"--sampler {s.sampler!r} is not one of {', '.join(SAMPLERS)}")
    for o in s.objectives:
        if o not in OBJECTIVES:
            raise SearchError(f"--objective {o!r} is not one of {', '.join(OBJECTIVES)}")
    if s.n_trials < 1:
        raise SearchError("--n-trials must be at least 1")


def open_study(s: StudySettings, space: Space):
    import optuna

    check_settings(s)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our tables say what failed and why
    from optuna.storages import RDBStorage

    from moetune.search.study.resume import check_same_inputs, check_storage_file

    check_storage_file(s.storage)
    storage = _storage(s, RDBStorage)
    directions = [OBJECTIVES[o][1] for o in s.objectives]
    try:
        study = optuna.create_study(study_name=s.study, storage=storage, directions=directions,
                                    sampler=make_sampler(s, space), load_if_exists=True)
    except ValueError as exc:
        raise SearchError(f"study '{s.study}': {exc}") from None
    if [d.name.lower() for d in study.directions] != directions:
        raise SearchError(f"study '{s.study}' exists with other objectives; use another --study name")
    study.set_metric_names(list(s.objectives))
    if s.inputs is not None:
        check_same_inputs(study, s.inputs, s.allow_changed_inputs)
    return study


def _storage(s: StudySettings, RDBStorage, attempts: int = 5):
    """Open the RDB storage; workers starting together race to create its tables, so an integrity
    error on a fresh database is retried after a moment (the other worker has created them)."""
    import time

    for attempt in range(attempts):
        try:
            import warnings

            with warnings.catch_warnings():  # deprecated in Optuna 4.9 but the one that re-queues (tested)
                warnings.simplefilter("ignore", FutureWarning)
                return _unsynced_sqlite(RDBStorage(s.storage, heartbeat_interval=s.heartbeat_s,
                                                   grace_period=s.grace_s,
                                                   failed_trial_callback=_retry_callback()(max_retry=3)),
                                        s.storage)
        except Exception as exc:  # sqlalchemy raises many types for a bad URL or an unreachable server
            racing = type(exc).__name__ in ("IntegrityError", "ProgrammingError", "OperationalError")
            if racing and attempt + 1 < attempts:
                time.sleep(0.5 + attempt)
                continue
            raise SearchError(f"--storage {s.storage!r} cannot be opened ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160]})") from None


def _unsynced_sqlite(storage, url: str):
    """An SQLite file's connections in WAL mode with synchronous=NORMAL: a commit no longer waits for
    the disk (a trial writes ~40 times: ~0.1 s of fsyncs per simulated trial here); the database
    stays consistent after a crash, a power cut may lose the last commits. Other storages as they are."""
    if not url.startswith("sqlite:///") or url.endswith(":memory:"):
        return storage
    from sqlalchemy import event

    def pragmas(conn, _record):
        cur = conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()  # the connections opened while creating the tables: reopened with the pragmas
    return storage


def make_sampler(s: StudySettings, space: Space):
    import optuna

    cons = _constraints_func if s.constraints.count() else None
    if s.sampler == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=s.seed)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=s.seed, constraints_func=cons, population_size=20)
    return optuna.samplers.TPESampler(seed=s.seed, constraints_func=cons, multivariate=True, group=True,
                                      n_startup_trials=10)  # group: the conditional knobs (`suggest`) modelled together


def _constraints_func(trial) -> list[float]:
    return trial.user_attrs.get("constraints", [1.0])


def suggest(trial, space: Space, conditional: bool = True) -> Deployment:
    """The trial's point. `conditional` (every sampler but grid): a knob that is moot given the knobs drawn
    before it (`moot`) is not drawn and keeps its neutral value, the one `canonical` would give it, so the
    sampler draws in the canonical space rather than among twins of one point."""
    values: dict = {}
    for k in space.knobs:
        if conditional and len(k.values) > 1 and moot(k.name, {**NEUTRAL, **values}):
            continue
        values[k.name] = trial.suggest_categorical(k.name, list(k.values))
    return Deployment(**{**Deployment().as_dict(), **values})


def moot(name: str, v: dict) -> bool:
    """Whether knob `name` changes nothing given the values `v` of the knobs before it (space.canonical's and
    deploy_knobs.canonical_deploy's rules, and repair's: offloading runs on one rank)."""
    if name in ("redundant_experts", "placement", "overlap"):
        return v["ep_size"] == 1
    if name == "quant_hot_fraction":
        return v["quant_low_format"] == "none"
    if name == "offload_resident_fraction":
        return v["ep_size"] > 1
    if name in ("offload_prefetch_depth", "offload_eviction"):
        return v["offload_resident_fraction"] >= 1
    if name == "offload_hints":
        return v["offload_resident_fraction"] >= 1 or not v["offload_prefetch_depth"]
    if name == "capacity_factor":
        return v["capacity_policy"] == "none"
    if name == "moe_a2a":  # deploy_knobs.canonical_deploy's rules
        return not v["attn_dp"] or v["ep_size"] == 1
    if name in ("decode_workers", "prefill_ep", "prefill_tp", "prefill_expert_tp", "prefill_tokens"):
        return not v["prefill_workers"]
    return False


def run_study(s: StudySettings, space: Space, limits: Limits, evaluator: Evaluator,
              on_trial: Callable[[TrialRow, int], None] | None = None, seeds: list | None = None):
    """Run trials until the study holds `n_trials` counted trials; returns the study. `seeds`
    (seeds.Seed): queued first in a new study when `s.reference_trials` (the grid sampler visits its own
    grid), at most `n_trials` of them; they count against the budget like any trial."""
    import optuna

    study = open_study(s, space)
    if s.reference_trials and s.sampler != "grid" and seeds and not study.get_trials(deepcopy=False):
        for seed in seeds[: s.n_trials]:
            study.enqueue_trial(seed.params, user_attrs={"seeded": seed.name}, skip_if_exists=True)

    def objective(trial):
        if trial.user_attrs.get("requeued_from") is None:
            _requeue_stale(study)
        if _rank(study, trial.number) >= s.n_trials:
            trial.set_user_attr("surplus", True)
            study.stop()
            raise optuna.TrialPruned("budget reached by other trials")
        d = suggest(trial, space, conditional=s.sampler != "grid")
        trial.set_user_attr("constraints", [1.0] * max(s.constraints.count(), 1))
        meshes = any(k.name == "attn_dp" and max(k.values) > 0 for k in space.knobs)  # a GPU search's meshes
        d, repaired = repair(d, limits.num_experts, limits.max_ranks, meshes)
        reason = prune(d, limits)
        rule = evaluator.memory_rule() if reason is None else None
        d, fitted = fit_memory(d, space, limits, rule) if rule is not None else (d, [])
        d, notes = canonical(d, limits)
        notes = repaired + fitted + notes
        reason = reason or evaluator.check(d)
        if reason:
            trial.set_user_attr("pruned_reason", reason)
            raise optuna.TrialPruned(reason)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        key = json.dumps(d.as_dict(), sort_keys=True)
        trial.set_user_attr("canonical", key)
        if notes:
            trial.set_user_attr("same_as", "; ".join(notes))
        reused = _finished_twin(study, trial, key)
        if reused is not None:
            metrics = reused.user_attrs["metrics"]
            trial.set_user_attr("reused_from", reused.number)
            if s.sampler != "grid":  # a twin of a priced point spends no budget (`_counted`; the grid visits its own)
                trial.set_user_attr("twin", True)
        else:
            try:
                metrics = evaluator.evaluate(d).as_dict()
            except Exception as exc:  # recorded on the trial; the study goes on
                trial.set_user_attr("fail_reason", _one_line(exc))
                raise
        m = Metrics(**metrics)
        trial.set_user_attr("metrics", metrics)
        trial.set_user_attr("constraints", s.constraints.values(m) or [0.0])
        if s.constraints.violations(m):
            trial.set_user_attr("infeasible_reason", "; ".join(s.constraints.violations(m)))
        trial.set_user_attr("evaluator", evaluator.name)
        values = [m.value(o) for o in s.objectives]
        return values[0] if len(values) == 1 else values

    def after(study_, frozen):
        trials = study_.get_trials(deepcopy=False)
        done = _counted_done(study_, trials)
        if on_trial is not None and not frozen.user_attrs.get("surplus"):
            on_trial(to_row(frozen), done)
        if done >= s.n_trials or _twins_in_a_row(trials) >= max(TWIN_RUN, s.n_trials):
            study_.stop()  # the budget spent, or the space holds no more new points the sampler finds

    _requeue_stale(study)
    if _counted_done(study) < s.n_trials:
        study.optimize(objective, n_trials=None, callbacks=[after], catch=(Exception,), gc_after_trial=False)
    return study


def _retry_callback():
    """Optuna's callback that re-queues a stale trial with its parameters."""
    import warnings

    import optuna.storages as st

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return st.RetryFailedTrialCallback


def retried_number(trial) -> int | None:
    """The number of the stale trial this one re-runs, or None."""
    if "requeued_from" in trial.user_attrs:
        return int(trial.user_attrs["requeued_from"])
    return _retry_callback().retried_trial_number(trial)


def _requeue_stale(study) -> None:
    """A trial failed by Optuna's heartbeat check (its worker died: no `fail_reason` of ours) is queued
    again with its parameters unless that happened already."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    _fail_never_beaten(study)
    trials = study.get_trials(deepcopy=False)
    done = {retried_number(t) for t in trials}
    for t in trials:
        params = _chosen_params(t)
        if (t.state == optuna.trial.TrialState.FAIL and "fail_reason" not in t.user_attrs
                and t.number not in done and params):
            study.enqueue_trial(params, user_attrs={"requeued_from": t.number}, skip_if_exists=False)


def _chosen_params(trial) -> dict:
    """The point a trial runs: its suggested parameters, or, for a queued trial that died before it
    suggested them, the parameters it was queued with."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params") or {})


def _fail_never_beaten(study) -> None:
    """Fail the RUNNING trials whose worker died before their first heartbeat.

    Optuna's stale check only looks at trials that have a heartbeat row. A worker creates its trial
    (`study.ask`, which also runs the sampler) and only then starts the heartbeat thread, so a
    worker killed in between leaves a RUNNING trial that Optuna never fails: the study would count
    it forever and never run its point. Such a trial older than the grace period is failed here
    (and re-queued by the caller). Its age is the worker's start time against this machine's clock,
    so workers on several machines need clocks in step to well within the grace period."""
    import datetime

    import optuna

    storage = study._storage
    grace = getattr(_rdb(storage), "grace_period", None)
    beating = _trials_with_heartbeat(study)
    if grace is None or beating is None:
        return
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t._trial_id in beating or t.datetime_start is None:
            continue
        if (now - t.datetime_start).total_seconds() > grace:
            try:
                storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:  # its worker (or another) finished it
                pass


def _rdb(storage):
    """The RDB storage behind Optuna's caching wrapper."""
    return getattr(storage, "_backend", storage)


def _trials_with_heartbeat(study) -> set[int] | None:
    """Trial ids of this study that have a heartbeat row (RDB storage), or None where that cannot be
    read (another storage, or an Optuna whose RDB layout differs)."""
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
    except ImportError:
        return None
    storage = _rdb(study._storage)
    if not hasattr(storage, "scoped_session"):
        return None
    with _create_scoped_session(storage.scoped_session) as session:
        rows = (session.query(models.TrialHeartbeatModel.trial_id)
                .join(models.TrialModel, models.TrialModel.trial_id == models.TrialHeartbeatModel.trial_id)
                .filter(models.TrialModel.study_id == study._study_id).all())
    return {trial_id for (trial_id,) in rows}


def _counted(trials) -> list:
    """Trials that count against the budget: not surplus, not a dead worker's trial (re-queued, or
    killed before it chose a point)."""
    import optuna

    retried = {retried_number(t) for t in trials}
    return [t for t in trials if not t.user_attrs.get("surplus") and not t.user_attrs.get("twin")
            and t.number not in retried
            and not (t.state == optuna.trial.TrialState.FAIL and not t.params)]


TWIN_RUN = 10  # twins in a row (at least; or --n-trials of them) after which a study stops: no new point is found


def _twins_in_a_row(trials) -> int:
    """The finished trials since the last one that was not a twin (a priced point, a prune, a failure)."""
    import optuna

    run = 0
    for t in sorted(trials, key=lambda t: -t.number):
        if t.state in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING):
            continue
        if not t.user_attrs.get("twin"):
            break
        run += 1
    return run


def _rank(study, number: int) -> int:
    import optuna

    trials = study.get_trials(deepcopy=False)
    return sum(1 for t in _counted(trials) if t.number < number and t.state != optuna.trial.TrialState.WAITING)


def _counted_done(study, trials=None) -> int:
    """Finished trials that count against the budget (`trials`: the study's, when already read)."""
    import optuna

    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    return sum(1 for t in _counted(trials) if t.state in done)


def _finished_twin(study, trial, key: str, wait_s: float = 120.0):
    """A trial of the same canonical deployment that finished (its result is reused); one that another
    worker is running with a lower number is waited for, so no point is evaluated twice at once."""
    import time

    import optuna

    deadline = time.monotonic() + wait_s
    while True:
        twins = [t for t in study.get_trials(deepcopy=False)
                 if t.number < trial.number and t.user_attrs.get("canonical") == key]
        for t in twins:
            if t.state == optuna.trial.TrialState.COMPLETE and "metrics" in t.user_attrs:
                return t
        if not any(t.state == optuna.trial.TrialState.RUNNING for t in twins) or time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def to_row(t) -> TrialRow:
    a = t.user_attrs
    reason = a.get("pruned_reason") or a.get("fail_reason") or a.get("infeasible_reason")
    if t.state.name == "FAIL" and reason is None:
        reason = "worker stopped (heartbeat lost); re-queued" if t.system_attrs.get("fail_reason") is None \
            else t.system_attrs.get("fail_reason")
    canonical = json.loads(a["canonical"]) if "canonical" in a else None
    twin = [f"ran as its twin ({a['same_as']})"] if a.get("same_as") else []
    twin += [f"result of trial {a['reused_from']}"] if "reused_from" in a else []
    reason = "; ".join([*([reason] if reason else []), *twin]) or None
    cons = a.get("constraints") or []
    return TrialRow(t.number, t.state.name, dict(t.params), list(t.values) if t.values else None,
                    a.get("metrics"), reason, all(c <= 0 for c in cons), canonical, a.get("seeded"),
                    bool(a.get("twin")))


def rows(study) -> list[TrialRow]:
    return [to_row(t) for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("surplus")]


def pareto(study) -> list[TrialRow]:
    """Feasible, complete, non-dominated trials (one objective: the best)."""
    directions = [d.name.lower() for d in study.directions]
    done = [r for r in rows(study) if r.state == "COMPLETE" and r.feasible and r.values]
    sign = [1 if d == "maximize" else -1 for d in directions]

    def dominates(a, b):
        better = [sa * x >= sa * y for sa, x, y in zip(sign, a.values, b.values)]
        strictly = [sa * x > sa * y for sa, x, y in zip(sign, a.values, b.values)]
        return all(better) and any(strictly)

    front = [r for r in done if not any(dominates(o, r) for o in done if o is not r)]
    unique, seen = [], set()
    for r in sorted(front, key=lambda r: [-s * v for s, v in zip(sign, r.values)]):
        key = _point(r)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def ranked(study) -> list[TrialRow]:
    """Feasible complete trials, best first on the first objective."""
    sign = 1 if study.directions[0].name.lower() == "maximize" else -1
    done = [r for r in rows(study) if r.state == "COMPLETE" and r.feasible and r.values]
    unique, seen = [], set()
    for r in sorted(done, key=lambda r: -sign * r.values[0]):
        key = _point(r)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def _point(r: TrialRow) -> str:
    """The deployment a row ran, as a key: twins (one canonical point) are one row of a ranking."""
    return json.dumps(r.canonical if r.canonical is not None else r.params, sort_keys=True)
