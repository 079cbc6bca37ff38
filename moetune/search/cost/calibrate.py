"""How `--hardware this-machine` is calibrated: per-phase call-overhead multipliers and the
fast-path factor, fitted on microbenchmarks taken now (default) or on the trace's own phase times.

On a CPU, a small MoE's phases are dominated by per-call overhead, not by FLOPs or bytes, and how
many torch calls a phase makes is a property of moetune's engine that `CALLS` (phase_costs.py) only
sketches. Given phase times measured on this machine, each phase's seconds minus its roofline time
is divided by its sketched call overhead (CALLS × the microbenchmarked cost of one call):

    k_phase = Σ max(measured − roofline, 0) / Σ calls(B, active) · op_overhead      over every (step, layer)

and the simulator multiplies that phase's call overhead by k_phase: one number per phase and step
kind (`attention/prefill`, `attention/decode`, and `attention` over both as the fallback).

Where the phase times come from (`Calibration.source`):

  microbenchmarks  (default) microbench.py runs the trace's model now, at the shapes the trace's
                   workload implies, a few repeats interleaved; each repeat gives its own k, the
                   rate kept is their median and its spread half their range over the median. The
                   same runs without a probe give the fast-path factor per step kind,
                   `path/<kind>` = Σ plain step seconds / Σ probed step seconds (on the CPU,
                   decode steps run fused layer kernels when no probe times phases), and
                   `unfused/<kind>` (every layer unfused, no clocks: the path of R > 1 ranks);
                   the simulator multiplies a step by the factor of its path. Cached per machine fingerprint
                   (machine_cache.py), so repeated simulations price alike; the trace then gives
                   only routing, lengths and arrivals.
  trace            the run's own phases.parquet (how moetune priced this-machine before): the
                   label then says how far the machine the trace was recorded on (env.json
                   `machine`) is from the machine now.

Rates are keyed `<what>/<phase>[/<kind>]` (`k/experts/decode`, `path/decode`,
`link/all_to_all/R2`), each a value with its spread, so other measured terms (collectives of other
parallelisms) are added as keys, not fields.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from moetune.search.cost.hardware import Hardware
from moetune.search.cost.simmodel import SimModel

FITTED = ("attention", "router", "permute", "experts", "unpermute", "shared_expert", "dense_mlp", "other")


def fit_multipliers(tables, m: SimModel, hw: Hardware, calls: dict) -> dict[str, float]:
    steps = tables.steps.set_index("step")
    ph = tables.phases
    active = (tables.expert_load[tables.expert_load.tokens > 0].groupby(["step", "layer"]).size()
              .rename("active"))
    rows = tables.moe.set_index(["step", "layer"]).rows
    out = {}
    for phase in FITTED:
        for kind in (None, "prefill", "decode"):
            df = ph[(ph.phase == phase) & ((ph.kind == kind) if kind else True)]
            k = _fit(df, phase, steps, active, rows, m, hw, calls)
            if k is not None:
                out[phase if kind is None else f"{phase}/{kind}"] = k
    return out


def _fit(df, phase, steps, active, rows, m, hw, calls) -> float | None:
    if df.empty:
        return None
    B = steps.batch.reindex(df.step).to_numpy(dtype=float)
    T = steps.tokens.reindex(df.step).to_numpy(dtype=float)
    pairs = steps.attn_pairs.reindex(df.step).to_numpy(dtype=float)
    ctx = steps.context_tokens.reindex(df.step).to_numpy(dtype=float)
    idx = pd.MultiIndex.from_arrays([df.step, df.layer])
    act = active.reindex(idx).fillna(0).to_numpy(dtype=float)
    r = rows.reindex(idx).fillna(0).to_numpy(dtype=float)
    roof, n_calls = _roof_and_calls(phase, m, hw, calls, B, T, pairs, ctx, act, r)
    overhead = n_calls * hw.op_overhead_s
    residual = np.maximum(df.seconds.to_numpy() - roof, 0.0)
    return float(residual.sum() / overhead.sum()) if overhead.sum() > 0 else None


def _roof_and_calls(phase, m: SimModel, hw: Hardware, calls, B, T, pairs, ctx, active, rows):
    b, F, BW = hw.act_bytes, hw.flops * hw.gemm_eff, hw.mem_bw * hw.mem_eff

    def roof(flops, nbytes):
        return np.maximum(flops / F, nbytes / BW)

    if phase == "attention":
        return (roof(2 * T * m.attn_weights + m.pair_flops * pairs, m.attn_weights * b + ctx * m.kv_elems * b),
                calls["attention"][0] + calls["attention"][1] * B)
    if phase == "router":
        return roof(2 * T * m.D * m.E, m.E * m.D * b + T * m.D * b), calls["router"][0] + 0 * B
    if phase == "permute":
        return roof(0 * T, 2 * T * m.K * m.D * b), calls["permute"][0] + 0 * B
    if phase == "unpermute":
        return roof(2 * T * m.K * m.D, (T * m.K + T) * m.D * b), calls["unpermute"][0] + 0 * B
    if phase == "experts":
        per_slot = 0 if hw.grouped_experts else calls["expert_slot"][0]
        return (roof(6 * rows * m.D * m.I, active * m.expert_weights * b), calls["experts_fixed"][0] + per_slot * active)
    if phase == "shared_expert":
        return roof(6 * T * m.D * m.I_shared, 3 * m.D * m.I_shared * b), calls["shared_expert"][0] + 0 * B
    if phase == "dense_mlp":
        i = max(m.dense_I) if m.dense_I else 0
        return roof(6 * T * m.D * i, 3 * m.D * i * b), calls["dense_mlp"][0] + 0 * B
    # other: LM head over each sequence's sampled token + per-step engine work
    return (roof(2 * B * m.D * m.V, m.D * m.V * b),
            calls["step"][0] + calls["step"][1] * B + calls["lm_head"][0] + calls["lm_head"][1] * B)


# ---- the calibration record ------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    value: float
    spread: float = 0.0  # half the range over repeats / the median (0: one figure)


@dataclass
class Calibration:
    source: str  # "microbenchmarks" | "trace"
    rates: dict[str, Rate]
    hardware: dict  # the Hardware figures priced with (this-machine: measured with the rates)
    state: dict  # machine_state() when the rates were measured (trace: now)
    seconds: float = 0.0  # how long the microbenchmarks took
    repeats: int = 0
    plan: dict = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)
    key: str = ""  # machine_cache key ("" for a trace calibration)
    cached: bool = False  # read from the cache, not measured in this process
    trace_state: dict | None = None  # trace: the machine state the trace's timings were taken in
    timed: list = field(default_factory=list)  # recipe paths timed by their own microbenchmark (`ensure`)

    def multipliers(self) -> dict[str, float]:
        return {k[2:]: r.value for k, r in self.rates.items() if k.startswith("k/")}

    def path_factor(self, kind: str, ranks: int = 1) -> float:
        """What a step of `kind` takes on the path a deployment runs over what the probed phases say:
        one rank, `path/<kind>` (fused decode layers); R > 1, `unfused/<kind>` (no clocks)."""
        r = self.rates.get(f"{'path' if ranks == 1 else 'unfused'}/{kind}")
        return r.value if r else 1.0

    def spread(self) -> float:
        """How reproducible the microbenchmarks were: the largest spread over repeats of a step kind's
        total probed time (`step/<kind>`)."""
        s = [r.spread for k, r in self.rates.items() if k.startswith("step/")]
        return max(s) if s else 0.0

    def label(self) -> str:
        """What the estimate was calibrated on, in one line (printed beside every this-machine estimate)."""
        if self.source == "trace":
            from moetune.profile.machine import state_distance

            return (f"calibrated on the trace's own phase times — {state_distance(self.trace_state, self.state)}; "
                    "the estimate follows how busy the machine was then")
        load = self.state.get("loadavg") or ["?"]
        how = "cached" if self.cached else f"measured in {self.seconds:.1f} s"
        cores = self.fingerprint.get("cores", 1)
        warn = (f"; taken on a busy machine ({self.state['runnable_others']:g} other tasks runnable on {cores} cores): "
                "measured again once it is quiet" if busy(self.state, cores) else "")
        return (f"calibrated on microbenchmarks of this machine taken {self.state.get('time_utc', '?')} "
                f"(load {load[0]}, {self.state.get('threads')} threads, {self.repeats} repeats, "
                f"step times ±{100 * self.spread():.0f} % over repeats, {how}{warn}{self._paths()}); the trace "
                "gives routing, "
                "lengths and arrivals only")

    def _paths(self) -> str:
        """The recipe paths with their own microbenchmark (variant/<key>, ep/R<r>, tp/G<g>), for the label."""
        keys = sorted({"/".join(k.split("/")[:2]) for k in self.rates if k.startswith(("variant/", "ep/", "tp/"))})
        return f"; own paths timed: {', '.join(keys)}" if keys else ""

    def as_entry(self) -> dict:
        data = asdict(self)
        data["rates"] = {k: [r.value, r.spread] for k, r in self.rates.items()}
        data.pop("cached")
        data.pop("timed")
        return data

    @staticmethod
    def from_entry(data: dict) -> "Calibration":
        rates = {k: Rate(float(v[0]), float(v[1])) for k, v in data["rates"].items()}
        return Calibration(**{**data, "rates": rates, "cached": True})

    def rates_of(self, prefix: str) -> dict[str, Rate]:
        """The rates under `prefix` (`variant/<key>`, `ep/R2`), by what follows it."""
        return {k[len(prefix) + 1:]: r for k, r in self.rates.items() if k.startswith(prefix + "/")}

    def ensure(self, prefix: str, measure) -> dict[str, Rate]:
        """The rates under `prefix`, measured by `measure()` (→ {name: Rate}) the first time a deployment
        needs them (its own microbenchmark: a few seconds), then kept in the calibration and its cache entry."""
        have = self.rates_of(prefix)
        if have:
            return have
        self.rates.update({f"{prefix}/{k}": r for k, r in measure().items()})
        self.timed.append(prefix)
        if self.key:
            from moetune.search.cost.machine_cache import store_entry

            store_entry(self.key, self.as_entry())
        return self.rates_of(prefix)

    def link_latency(self, ranks: int) -> float:
        """this-machine's seconds per small gloo all-to-all among `ranks` processes: measured the first
        time a calibration needs it (a few seconds), then kept in the calibration and its cache entry."""
        key = f"link/all_to_all/R{ranks}"
        if key not in self.rates:
            from moetune.search.cost.hardware import collective_latency

            self.rates[key] = Rate(collective_latency(ranks))
            if self.key:
                from moetune.search.cost.machine_cache import store_entry

                store_entry(self.key, self.as_entry())
        return self.rates[key].value


# ---- where a calibration comes from ----------------------------------------------------------------


def microbench_calibration(source, cfg, recalibrate: bool = False) -> tuple[Hardware, Calibration]:
    """this-machine from microbenchmarks at the trace's shapes: the cached ones for this machine's
    fingerprint, model shapes and plan, or measured now (and cached)."""
    from moetune.search.cost.hardware import calibrate as hardware_figures
    from moetune.search.cost.machine_cache import cache_key, fingerprint, load_entry, store_entry
    from moetune.search.cost.microbench import plan_for

    cfg = priced_config(source, cfg)
    plan = plan_for(source.workload, source.batch_size)
    fp = fingerprint(f"{cfg.model.kernel_backend}@{cfg.model.device}")
    key = cache_key(fp, {"model": asdict(source.model), "path": str(cfg.model.path), "dtype": cfg.model.dtype,
                         "plan": plan.as_dict()})
    entry = None if recalibrate else load_entry(key)
    if entry is not None and busy(entry.get("state", {}), fp["cores"]):
        from moetune.engine.threads import runnable_others

        if stale(entry["state"], runnable_others(), fp["cores"], time.time()):
            entry = None  # taken on a busy machine, which is quiet now: measure again
    if entry is not None:
        try:
            cal = Calibration.from_entry(entry)
            return Hardware(**cal.hardware), cal
        except (TypeError, KeyError, ValueError, IndexError):  # written by another version: measure again
            pass
    cal = measure_calibration(cfg, source.model, plan, hardware_figures)
    cal.fingerprint, cal.key = fp, key
    store_entry(key, cal.as_entry())
    return Hardware(**cal.hardware), cal


def priced_config(source, cfg):
    """The recipe with the trace's model: the model that is priced is the one timed."""
    if source.model_path and str(cfg.model.path) != str(source.model_path):
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": source.model_path})})
    return cfg


def measure_calibration(cfg, m: SimModel, plan, hardware_figures) -> Calibration:
    from moetune.profile.machine import machine_state
    from moetune.search.cost.microbench import median_run, run_bench
    from moetune.search.cost.phase_costs import CALLS

    state = machine_state()
    start = time.perf_counter()
    hw = hardware_figures()
    runs = run_bench(cfg, plan)
    samples: dict[str, list[float]] = {}  # each repeat's own figures: the spread
    for run in runs:
        for k, v in _figures(run, m, hw, CALLS).items():
            samples.setdefault(k, []).append(v)
    rates = {k: Rate(v, _spread(samples.get(k, [v]))) for k, v in _figures(median_run(runs), m, hw, CALLS).items()}
    return Calibration("microbenchmarks", rates, asdict(hw), state, seconds=time.perf_counter() - start,
                       repeats=len(runs), plan=plan.as_dict())


def _figures(run, m: SimModel, hw: Hardware, calls: dict) -> dict[str, float]:
    """k/<phase>[/<kind>] fitted on one run's probed phases; step/<kind>: its Σ probed step seconds;
    path/<kind>: Σ plain / Σ probed step seconds; unfused/<kind>: Σ unfused / Σ probed."""
    out = {f"k/{k}": v for k, v in fit_multipliers(run.tables, m, hw, calls).items()}
    probed = run.tables.steps.groupby("kind").seconds.sum()
    for kind, s in probed.items():
        out[f"step/{kind}"] = float(s)
        for name, steps in (("path", run.plain), ("unfused", run.unfused)):
            total = sum(sec for k, sec in steps if k == kind)
            if s > 0 and total > 0:
                out[f"{name}/{kind}"] = total / float(s)
    return out


def trace_calibration(source, hw: Hardware, recorded_state: dict | None) -> Calibration:
    """The old way, kept for comparison (`--calibrate-on trace`): k fitted on the trace's phase times."""
    from moetune.profile.machine import machine_state
    from moetune.search.cost.phase_costs import CALLS

    ks = fit_multipliers(source.tables, source.model, hw, CALLS)
    return Calibration("trace", {f"k/{k}": Rate(v) for k, v in ks.items()}, asdict(hw), machine_state(),
                       trace_state=recorded_state)


def busy(state: dict, cores: int) -> bool:
    """Other tasks were runnable on every core this process may use (engine/threads.py's rule)."""
    others = state.get("runnable_others")
    return others is not None and others >= cores


def stale(then: dict, others_now: float | None, cores: int, now: float, after_s: float = 60.0) -> bool:
    """Whether a calibration taken in machine state `then` should be measured again: it was taken on a
    busy machine, the machine is quiet now, and it is more than `after_s` old (not the one just taken)."""
    import calendar

    try:
        taken = calendar.timegm(time.strptime(then["time_utc"], "%Y-%m-%dT%H:%M:%SZ"))
    except (KeyError, ValueError):
        taken = 0.0
    quiet_now = others_now is not None and others_now < cores
    return busy(then, cores) and quiet_now and now - taken > after_s


def _spread(values: list[float]) -> float:
    """Half the range over repeats, relative to their median (0 for one repeat or a zero median)."""
    med = float(np.median(values))
    return float((max(values) - min(values)) / 2 / med) if med > 0 and len(values) > 1 else 0.0


# ---- the recipe's own path (a quant / offload variant, R expert-parallel ranks) ----------------------


def variant_key(d) -> str | None:
    """The name of a one-rank deployment's own path where it differs from the fp32 resident one the
    base calibration timed (`dense-int8`, `int4+hot0.25`, `offload0.5-pf2-lru`, joined by `,`), else None."""
    parts = []
    if d.dense_format in ("int8", "int4"):  # moetune's own quant.dense (precision.py DENSE_QUANT)
        parts.append(f"dense-{d.dense_format}")
    if d.quant_low_format != "none":
        parts.append(d.quant_low_format + (f"+hot{d.quant_hot_fraction:g}" if d.quant_hot_fraction else ""))
    if d.offload_resident_fraction < 1:
        parts.append(f"offload{d.offload_resident_fraction:g}-pf{d.offload_prefetch_depth}-{d.offload_eviction}"
                     f"-{d.offload_hints}")
    return ",".join(parts) or None


def bench_plan(cal: Calibration):
    from moetune.search.cost.microbench import BenchPlan

    p = cal.plan
    return BenchPlan(int(p["prompt_len"]), tuple(p["batches"]), int(p["decodes"]), int(p["repeats"]))


def variant_rates(base_cfg, variant_cfg, plan) -> dict[str, Rate]:
    """`<kind>`: the variant's plain step seconds over the base's, median over interleaved repeats."""
    from moetune.search.cost.microbench import run_variant_bench

    runs = run_variant_bench(base_cfg, variant_cfg, plan)
    kinds = sorted({k for r in runs for k in r})
    return {k: Rate(float(np.median([r[k] for r in runs if k in r])), _spread([r[k] for r in runs if k in r]))
            for k in kinds}


def ep_rates(base_cfg, plan, ranks: int, probed: dict[str, float]) -> dict[str, Rate]:
    """From the engine on `ranks` processes at the plan's buckets per rank (microbench.run_ep_bench):
    `compute/<kind>` = Σ (lock-step − exchange) seconds over Σ probed one-rank step seconds at the
    same per-rank buckets (`step/<kind>`: what the k multipliers were fitted on), the per-rank path
    factor at one thread per rank; `exchange/<kind>` = exchange seconds per MoE layer (the split
    sizes, the wait for the other ranks, the two row all-to-alls), medians over repeats."""
    from moetune.search.cost.microbench import run_ep_bench

    runs = run_ep_bench(base_cfg, plan, ranks)
    out: dict[str, Rate] = {}
    for kind, ref in probed.items():
        comp = [(r[kind][0] - r[kind][1]) / ref for r in runs if kind in r and ref > 0]
        exch = [r[kind][1] / r[kind][2] for r in runs if kind in r and r[kind][2] > 0]
        if comp:
            out[f"compute/{kind}"] = Rate(float(np.median(comp)), _spread(comp))
        if exch:
            out[f"exchange/{kind}"] = Rate(float(np.median(exch)), _spread(exch))
    return out


def tp_key(d) -> str:
    """The name of a tensor-parallel group's own path: `tp/G<g>` (tp_size G, experts split the same
    way, the engine's default), else `tp/G<g>-tp<t>-etp<e>`."""
    G, etp = max(d.tp_size, d.expert_tp_size), d.expert_tp_size
    return f"tp/G{G}" if d.tp_size == G and etp == G else f"tp/G{G}-tp{d.tp_size}-etp{etp}"


def tp_rates(base_cfg, plan, tp_size: int, expert_tp_size: int, probed: dict[str, float]) -> dict[str, Rate]:
    """From the engine's TP group on G processes at the plan's buckets (microbench.run_tp_bench):
    `compute/<kind>` = Σ (lock-step − collectives) seconds over Σ probed one-rank step seconds at the
    same buckets (`step/<kind>`), the group's per-rank factor over the whole model's probed path at one
    thread per rank; `allreduce/<kind>` and `gather/<kind>` = seconds per call of the [T, D] all-reduce
    (tp_allreduce, tp_embed) and of the LM head's all-gather at the measured sizes (the wait for the
    other rank included); `allreduce_bytes/<kind>`, `gather_bytes/<kind>` = their mean payload bytes
    per call (the sizes those seconds were measured at); medians over repeats."""
    from moetune.search.cost.microbench import run_tp_bench

    runs = run_tp_bench(base_cfg, plan, tp_size, expert_tp_size)
    out: dict[str, Rate] = {}
    for kind, ref in probed.items():
        rows = [r[kind] for r in runs if kind in r]
        series = {"compute": [(f["step_s"] - f["coll_s"]) / ref for f in rows if ref > 0]}
        for name, calls, nbytes in (("allreduce", "ar_calls", "ar_bytes"), ("gather", "ga_calls", "ga_bytes")):
            have = [f for f in rows if f[calls] > 0]
            series[name] = [f[f"{name}_s"] / f[calls] for f in have]
            series[f"{name}_bytes"] = [f[nbytes] / f[calls] for f in have]
        out.update({f"{name}/{kind}": Rate(float(np.median(v)), _spread(v)) for name, v in series.items() if v})
    return out

