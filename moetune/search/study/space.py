"""The search space: a table of knobs, each mapped to a RunConfig key, with its domain; and the
pruning rules that keep an invalid combination from ever being timed (each says why).

| knob | recipe key | domain | pruned when |
|---|---|---|---|
| ep_size | parallel.ep_size | divisors of E + N up to the hardware's ranks | (E + N) % R ≠ 0; R > ranks available |
| redundant_experts | parallel.redundant_experts | 0 .. E/2 (step E/16) | — (moot at R = 1: same as 0) |
| placement | parallel.placement | contiguous, round_robin, eplb | — (moot at R = 1: same as contiguous) |
| tp_size | parallel.tp_size (searched when --space names it, else the base recipe's value) | 1, 2, 4, 8 up to the hardware's ranks | not 1 or the group size G = max(tp_size, expert_tp_size); R × G > ranks available; G does not divide the heads, vocabulary or a dense intermediate size, or neither divides nor is a multiple of the KV heads |
| expert_tp_size | parallel.expert_tp_size | 1, 2, 4, 8 up to the hardware's ranks | not 1 or G; G does not divide the expert (or shared expert) intermediate size |
| replicas | — (one moetune process is one replica; emitted as the engines' data-parallel size) | divisors of the hardware's GPUs | replicas × R × G > GPUs; replicas > 1 and replicas × R × G ≠ GPUs (nodes × GPUs per node = replicas × ranks per replica) |
| max_num_seqs | engine.max_num_seqs | 8 .. 1024, powers of 2 | — (above the requests a rank holds: same as the smallest value holding them; never moot when the load is found per trial, cost/slo_load.py) |
| max_num_batched_tokens | engine.max_num_batched_tokens | 256 .. 16384, powers of 2 | below max_num_seqs; below the longest request (prompt + output) with chunked prefill off (both refused by the engines: `engine_refuses`) |
| quant_low_format | quant.low / quant.experts | none, fp8, int8, int4 (= int4-g64) | — |
| quant_hot_fraction | quant.hot_fraction | 0, 0.125, 0.25, 0.5 | GPU hardware with a low format (no engine serves a per-expert mix: engine_formats.py, which also fixes it at 0 in a GPU space) — (moot with low format none) |
| offload_resident_fraction | offload.resident_experts | 1, 0.75, 0.5, 0.25 of a rank's slots | fewer resident slots per rank than top-K; ep_size > 1 (offloading runs on one rank) |
| offload_prefetch_depth | offload.prefetch_depth | 0 .. 3 | — (moot with nothing offloaded) |
| offload_eviction | offload.policy | lru, lfu | — (moot with nothing offloaded) |
| capacity_policy | parallel.capacity_policy (searched when --space names it, as the four below) | none, drop, buffer, reroute | simulate: reroute (the trace has the routers' choices, not their scores) |
| capacity_factor | parallel.capacity_factor | 1.0, 1.25, 1.5, 2.0 (any factor > 0) | — (moot with policy none) |
| scheduling | engine.scheduling | fcfs, affinity | simulate: affinity (no model of its predictor: measure it) |
| offload_hints | offload.hints | router, history, both | simulate: history, both (likewise) — (moot with nothing offloaded or prefetch depth 0) |
| speculative | engine.speculative (searched when --space names it) | none, ngram:K, draft:DIR:K, mtp:K (1 <= K <= 16) | mtp:K on a model without MTP layers (config.json num_nextn_predict_layers); a value the recipe refuses; simulate: no acceptance known (neither the trace's profile with that speculator nor --spec-acceptance) |
| dense_format | — (the engines' `--quantization fp8`; priced on GPU hardware); this-machine: quant.dense when --space names it (machine_space.py) | none, fp8; this-machine: none, int8, int4 | — |
| kv_format | — (`--kv-cache-dtype fp8` / `fp8_e4m3`; GPU only) | none, fp8 | — |
| overlap | — (SGLang `--enable-two-batch-overlap`, vLLM `--enable-dbo`; GPU only) | 0, 1 | — (moot at ep_size 1: nothing to overlap) |
| cuda_graph_max_bs | — (SGLang `--cuda-graph-max-bs-decode` / `--disable-decode-cuda-graph`, vLLM `--max-cudagraph-capture-size` / `--enforce-eager`; GPU only; 512 unless --space names it: no other value gives a faster step; its memory is priced) | 0 (eager), 32, 128, 512 | — (kept as sampled: a size above the decode batch a rank holds prices the same, and the launch flags say the size) |

A sampled point is first repaired (repair.py: N rounded up to tile R, replicas filling the GPUs,
offloading dropped at R > 1; in simulated searches a point over memory stepped to the nearest that
fits), so these rules prune only what no repair runs. And, for every
candidate, the memory rule: the simulator's per-rank memory estimate must fit the
hardware (else pruned with both figures). "Moot" knobs are not invalid: `canonical` maps such a
point onto its twin, which is timed once; the other twins reuse its result (`reused_from`).

The quant and offload knobs become whole recipe sections (`quant_section`, `offload_section`): a
low format with hot fraction 0 is `quant.experts`; with a hot fraction, the hot experts (ranked by
the trace's expert loads) keep the model's precision; the resident fraction is written as a count
of the rank's slots, rounded up, the same number the simulator prices. A knob is searched only
when RunConfig accepts its key (`recipe_accepts`); `--what-if` adds knobs a recipe cannot say yet
to simulated searches (none at present); `replicas` and the serving engines' knobs (dense and KV
precision, two-batch overlap, CUDA-graph capture size) are searched without a recipe key
(PRICED_ONLY: the simulator prices them on GPU hardware, where the emitted launch flags say them;
a this-machine search never proposes them: moetune's CPU engine has none of them). The NAMED_ONLY knobs
(capacity, scheduling, prefetch hints) are in the space only when --space names them, else they keep
the base recipe's values (a one-value knob only where that is not the neutral one), so a default
space is the grid it was before them. To add a knob: one `Knob(...)` row in `KNOBS`, a field in
`Deployment`, its recipe mapping in `to_config`, and, when it has one, a pruning rule in `prune`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from moetune.config import RunConfig, parse_config
from moetune.errors import MoetuneError
from moetune.search.cost.deployment import Deployment, dp_ranks, resident_slots
from moetune.search.cost.deployment import gpus as replica_gpus
from moetune.search.cost.disagg import total_gpus
from moetune.search.cost.precision import DENSE_QUANT, dense_knob, dense_quant
from moetune.search.cost.simmodel import SimModel
from moetune.search.cost.tp import group_size, tp_reason
from moetune.search.study.deploy_knobs import (DEPLOY_KNOBS, canonical_deploy, default_searched, deploy_rows,
                                               deploy_section, deploy_values, prune_deploy)


PRICED_ONLY = ("replicas", "dense_format", "kv_format", "overlap", "cuda_graph_max_bs", *DEPLOY_KNOBS)  # searched by default on
# priced (simulated GPU) searches though no recipe key says them: the serving engines' knobs (their launch flags)
RECIPE_VALUES = {"dense_format": tuple(DENSE_QUANT)}  # values of a PRICED_ONLY knob a recipe does say (quant.dense:
# moetune's engine packs the dense projections; machine_space.py): read from and written to a recipe, run by `measure`
GRAPH_SIZES = (0, 32, 128, 512)  # cuda_graph_max_bs on GPUs: 0 eager, else the largest decode batch per rank captured
DOMINATED = {"cuda_graph_max_bs": 512}  # never a slower step than its other values (its graph memory, capped at
# max_num_seqs, is priced: memory.py): one value unless --space names the knob, so that it does not dilute a small
# trial budget
OPT_IN = ("tp_size", "expert_tp_size")  # searched when --space names them, else the base recipe's values: of
# their 16 pairs 6 are no mesh (each must be 1 or the group size), which would eat a small trial budget
NAMED_ONLY = ("capacity_policy", "capacity_factor", "scheduling", "offload_hints", "speculative")  # in the space when --space
# names them; else the base recipe's values, and out of the grid (params, trials.csv) where those are neutral


class SpaceError(MoetuneError):
    """A malformed --space file (unknown knob, value outside its domain)."""


@dataclass(frozen=True)
class Knob:
    name: str  # Deployment field and Optuna parameter name
    key: str  # the RunConfig key it sets ("section.field")
    values: tuple  # the domain, in order
    what: str


def default_knobs(num_experts: int, max_ranks: int) -> list[Knob]:
    E = num_experts
    step = max(1, E // 16)
    divisors = tuple(r for r in range(1, max_ranks + 1) if any((E + n) % r == 0 for n in range(0, E // 2 + 1, step)))
    gpus = tuple(r for r in range(1, max_ranks + 1) if max_ranks % r == 0)
    groups = tuple(g for g in (1, 2, 4, 8) if g <= max(max_ranks, 1))
    return [
        Knob("ep_size", "parallel.ep_size", divisors, "expert-parallel ranks R"),
        Knob("tp_size", "parallel.tp_size", groups, "tensor-parallel ranks G of attention, dense MLPs, vocab"),
        Knob("expert_tp_size", "parallel.expert_tp_size", groups, "ranks each expert's intermediate dim is split over"),
        Knob("replicas", "deploy.replicas", gpus, "copies of the deployment across the hardware's GPUs"),
        Knob("redundant_experts", "parallel.redundant_experts", tuple(range(0, E // 2 + 1, step)),
             "extra slots for hot-expert replicas N"),
        Knob("placement", "parallel.placement", ("contiguous", "round_robin", "eplb"), "placement policy"),
        Knob("max_num_seqs", "engine.max_num_seqs", SEQS, "sequences running per rank"),
        Knob("max_num_batched_tokens", "engine.max_num_batched_tokens", (256, 512, 1024, 2048, 4096, 8192, 16384),
             "tokens per step per rank"),
        Knob("quant_low_format", "quant.low", ("none", "fp8", "int8", "int4"), "format of the cold experts"),
        Knob("quant_hot_fraction", "quant.hot_fraction", (0.0, 0.125, 0.25, 0.5), "experts kept in full precision"),
        Knob("offload_resident_fraction", "offload.resident_fraction", (1.0, 0.75, 0.5, 0.25),
             "expert slots resident per rank"),
        Knob("offload_prefetch_depth", "offload.prefetch_depth", (0, 1, 2, 3), "layers prefetched ahead"),
        Knob("offload_eviction", "offload.policy", ("lru", "lfu"), "which resident expert leaves"),
        Knob("capacity_policy", "parallel.capacity_policy", ("none", "drop", "buffer", "reroute"),
             "what a copy beyond the per-expert capacity does"),
        Knob("capacity_factor", "parallel.capacity_factor", (1.0, 1.25, 1.5, 2.0),
             "per-expert capacity C = ceil(factor · T · K / E) per rank's step"),
        Knob("scheduling", "engine.scheduling", ("fcfs", "affinity"), "admission order"),
        Knob("offload_hints", "offload.hints", ("router", "history", "both"), "where prefetch predictions come from"),
        Knob("speculative", "engine.speculative", ("none", "ngram:2", "ngram:4", "mtp:1", "mtp:2"),
             "speculator × draft tokens verified per decode (any ngram:K, draft:DIR:K, mtp:K)"),
        Knob("dense_format", "deploy.dense_format", ("none", "fp8"), "attention / dense / shared-expert weights"),
        Knob("kv_format", "deploy.kv_format", ("none", "fp8"), "KV-cache precision"),
        Knob("overlap", "deploy.overlap", (0, 1), "two-batch overlap of dispatch/combine with compute"),
        Knob("cuda_graph_max_bs", "deploy.cuda_graph_max_bs", GRAPH_SIZES, "largest decode batch per rank in a CUDA graph"),
        *(Knob(*row) for row in deploy_rows(max_ranks)),  # meshes and disaggregation (deploy_knobs.py)
    ]


def recipe_accepts(key: str) -> bool:
    """Whether RunConfig has this `section.field` (optional sections included)."""
    section, _, name = key.partition(".")
    field = RunConfig.model_fields.get(section)
    if field is None:
        return False
    kinds = [field.annotation, *getattr(field.annotation, "__args__", ())]  # `X | None` → X
    return any(name in getattr(kind, "model_fields", {}) for kind in kinds)


@dataclass(frozen=True)
class Space:
    knobs: tuple[Knob, ...]  # searched knobs (one value = fixed)

    def grid(self) -> dict[str, list]:
        return {k.name: list(k.values) for k in self.knobs}

    def size(self) -> int:
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n

    def points(self) -> list[Deployment]:
        """Every point of the grid (unpruned), in a fixed order."""
        import itertools

        names = [k.name for k in self.knobs]
        return [Deployment(**dict(zip(names, combo))) for combo in itertools.product(*(k.values for k in self.knobs))]


def build_space(num_experts: int, max_ranks: int, what_if: bool = False, overrides: dict | None = None,
                priced: bool = True, fixed: dict | None = None) -> Space:
    """The knobs RunConfig accepts (plus the what-if ones when asked, and PRICED_ONLY when a simulator
    prices the trials: `priced`), narrowed by `overrides` ({knob: [values]} or {knob: value}); OPT_IN
    knobs not overridden take one value, `fixed`'s (the base recipe's), else 1; NAMED_ONLY knobs not
    overridden take `fixed`'s value where it is not the neutral one, else are left out."""
    knobs = [k for k in default_knobs(num_experts, max_ranks)  # PRICED_ONLY: the serving engines' (deploy.*)
             if ((priced or what_if) if k.name in PRICED_ONLY else (what_if or recipe_accepts(k.key)))]
    overrides = dict(overrides or {})
    by_name = {k.name: k for k in default_knobs(num_experts, max_ranks)}
    unknown = sorted(set(overrides) - set(by_name))
    if unknown:
        raise SpaceError(f"--space: unknown knob '{unknown[0]}' (knobs: {', '.join(by_name)})")
    out = []
    for knob in knobs:
        if knob.name in overrides:
            values = overrides.pop(knob.name)
            values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
            if not values:
                raise SpaceError(f"--space: knob '{knob.name}' has no values")
            knob = replace(knob, values=tuple(_coerce(knob, v) for v in values))
        elif knob.name in DOMINATED:
            knob = replace(knob, values=(DOMINATED[knob.name],))
        elif knob.name in OPT_IN:
            knob = replace(knob, values=((fixed or {}).get(knob.name, 1),))
        elif knob.name in NAMED_ONLY or (knob.name in DEPLOY_KNOBS and not default_searched(knob.name, max_ranks)):
            value = (fixed or {}).get(knob.name, NEUTRAL[knob.name])
            if value == NEUTRAL[knob.name]:
                continue
            knob = replace(knob, values=(value,))
        out.append(knob)
    for name, values in overrides.items():  # a what-if knob fixed by the file while not searched: keep it fixed
        values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
        out.append(replace(by_name[name], values=tuple(_coerce(by_name[name], v) for v in values)))
    return Space(tuple(out))


def _coerce(knob: Knob, value: Any):
    kind = type(knob.values[0])
    if kind is str:
        if knob.name == "placement" and (str(value).endswith(".json")):
            return str(value)
        if knob.name == "speculative":
            return _speculative_value(value)
        if str(value) not in knob.values:
            raise SpaceError(f"--space: knob '{knob.name}' value {value!r} is not one of {list(knob.values)}")
        return str(value)
    try:
        coerced = kind(value)
    except (TypeError, ValueError):
        raise SpaceError(f"--space: knob '{knob.name}' value {value!r} is not a {kind.__name__}") from None
    if isinstance(value, bool) or coerced < 0:
        raise SpaceError(f"--space: knob '{knob.name}' value {value!r} must be a non-negative {kind.__name__}")
    if knob.name == "capacity_factor" and not coerced > 0:
        raise SpaceError(f"--space: knob 'capacity_factor' value {value!r} must be positive")
    return coerced


def _speculative_value(value: Any) -> str:
    from moetune.search.cost.speculative import parse_knob

    try:
        parse_knob(str(value))
    except ValueError as exc:
        raise SpaceError(f"--space: knob 'speculative': {exc}") from None
    return str(value)


def read_space_file(path: str | Path) -> dict:
    from moetune.config import read_yaml_mapping

    return read_yaml_mapping(path, "space file", SpaceError, "a map of knob names to a value or a list of values")


@dataclass(frozen=True)
class Limits:
    """What the pruning rules need to know about the model, hardware and workload."""

    num_experts: int
    top_k: int
    max_ranks: int
    requests: int  # the most requests in flight at once (all ranks; the workload's most_in_flight)
    per_replica: bool = False  # True: `requests` is each replica's (steady state); False: split over replicas
    model: SimModel | None = None  # the sizes a tensor-parallel split must divide (None: not checked)
    mtp_layers: int = 0  # the model's MTP modules (config.json num_nextn_predict_layers): what mtp:K drafts with
    max_model_len: int = 0  # the longest request (prompt + output tokens): engines size their batch rules by it
    chunked_prefill: bool = True  # the recipe's engine.chunked_prefill


def prune(d: Deployment, lim: Limits) -> str | None:
    """The reason this deployment cannot run (it is never timed), or None (memory is checked by the
    evaluator's estimate, `memory_reason`)."""
    E, R, N = lim.num_experts, d.ep_size, d.redundant_experts
    if R > lim.max_ranks:
        return f"ep_size {R} needs more ranks than the hardware has ({lim.max_ranks})"
    split = (prune_deploy(d, lim.model, lim.max_ranks) if d.attn_dp or d.prefill_workers else None) or (
        None if d.attn_dp else _prune_tp(d, lim))
    if split is not None:
        return split
    ranks, mesh = (total_gpus(d) if d.prefill_workers else replica_gpus(d)), _mesh(d)
    G, used = lim.max_ranks, d.replicas * ranks
    if used > G:
        return f"{d.replicas} replicas × {mesh} need {used} GPUs; the hardware has {G}"
    if d.replicas > 1 and used != G:
        return (f"{d.replicas} replicas × {mesh} = {used} GPUs, not the hardware's {G} "
                "(nodes × GPUs per node = replicas × ranks per replica)")
    if (E + N) % R:
        return f"ep_size {R} does not divide the {E} experts + {N} redundant slots"
    refused = engine_refuses(d, lim)
    if refused is not None:
        return refused
    if d.offload_resident_fraction < 1 and R > 1:  # RunConfig refuses the pair: never a trial, never a winner
        return f"offload with ep_size {R} is not supported yet (offloading runs on one rank)"
    return _prune_speculative(d, lim) or _prune_what_if(d, lim)


def engine_refuses(d: Deployment, lim: Limits) -> str | None:
    """The batch-limit pairs the serving engines refuse at start-up (vLLM SchedulerConfig's checks:
    max_num_batched_tokens ≥ max_num_seqs, and ≥ max_model_len without chunked prefill; SGLang's
    --chunked-prefill-size has no lower bound, so vLLM's rules bound both), in words, or None."""
    if d.max_num_batched_tokens < d.max_num_seqs:
        return (f"max_num_batched_tokens {d.max_num_batched_tokens} is below max_num_seqs {d.max_num_seqs}: "
                "engines refuse it (vLLM: must be ≥ max_num_seqs; not one decode per running sequence)")
    if not lim.chunked_prefill and d.max_num_batched_tokens < lim.max_model_len:
        return (f"max_num_batched_tokens {d.max_num_batched_tokens} is below the longest request's "
                f"{lim.max_model_len} tokens with chunked prefill off: engines refuse it (vLLM: must be ≥ "
                "max_model_len unless chunked prefill is enabled)")
    return None


def _prune_speculative(d: Deployment, lim: Limits) -> str | None:
    """Speculation the engine cannot run: MTP without MTP layers, a value RunConfig refuses."""
    if d.speculative == "none":
        return None
    from moetune.config import parse_speculative

    if d.speculative.startswith("mtp:") and lim.mtp_layers < 1:
        return f"speculative {d.speculative}: the model has no MTP layers (config.json num_nextn_predict_layers)"
    try:
        parse_speculative(d.speculative)
    except ValueError as exc:
        return f"engine.speculative: {exc}"
    return None


def _prune_tp(d: Deployment, lim: Limits) -> str | None:
    G = group_size(d)
    if G == 1:
        return None
    reason = tp_reason(lim.model, d) if lim.model is not None else None
    if reason is None and (d.tp_size not in (1, G) or d.expert_tp_size not in (1, G)):
        reason = f"tp_size {d.tp_size} and expert_tp_size {d.expert_tp_size} must each be 1 or the group size {G}"
    if reason is None and d.ep_size * G > lim.max_ranks:
        reason = f"{_mesh(d)} = {d.ep_size * G} ranks; the hardware has {lim.max_ranks}"
    return reason


def _mesh(d: Deployment) -> str:
    G = group_size(d)
    return f"ep_size {d.ep_size}" if G == 1 else f"ep_size {d.ep_size} × tp group {G}"


def canonical(d: Deployment, lim: Limits) -> tuple[Deployment, list[str]]:
    """The same deployment with knobs that change nothing set to one value, and why: a point that
    runs the same as another is timed once (its twins reuse the result).

    - at ep_size 1, replicas and placement policies change nothing (contiguous, 0 redundant);
    - max_num_seqs above the requests a rank ever holds runs the same as the smallest value holding them;
    - with no low format the hot fraction is moot; with every expert resident, prefetch and eviction are;
    - with capacity policy none the factor is moot; with nothing offloaded or no prefetch, the hint source is."""
    notes, out = [], d
    if d.ep_size == 1 and (d.redundant_experts or d.placement != "contiguous"):
        out = replace(out, redundant_experts=0, placement="contiguous")
        notes.append("at ep_size 1 replicas and placement change nothing")
    per_replica = lim.requests if lim.per_replica else -(-lim.requests // d.replicas)
    per_rank = -(-per_replica // dp_ranks(d))  # a TP group's ranks hold the same requests
    holding = [s for s in SEQS if s >= per_rank]
    if holding and d.max_num_seqs > holding[0]:
        out = replace(out, max_num_seqs=holding[0], max_num_batched_tokens=max(d.max_num_batched_tokens, holding[0]))
        notes.append(f"max_num_seqs {d.max_num_seqs} runs the same as {holding[0]} (at most {per_rank} requests a rank)")
    if d.quant_low_format == "none" and d.quant_hot_fraction:
        out = replace(out, quant_hot_fraction=0.0)
        notes.append("no low format: the hot fraction is moot")
    if d.offload_resident_fraction >= 1 and (d.offload_prefetch_depth or d.offload_eviction != "lru"):
        out = replace(out, offload_prefetch_depth=0, offload_eviction="lru")
        notes.append("every expert resident: prefetch and eviction are moot")
    if d.overlap and d.ep_size == 1:
        out = replace(out, overlap=0)
        notes.append("at ep_size 1 there is no dispatch/combine to overlap")
    return _canonical_named(*canonical_deploy(out, notes))


def _canonical_named(d: Deployment, notes: list[str]) -> tuple[Deployment, list[str]]:
    out = d
    if d.capacity_policy == "none" and d.capacity_factor != NEUTRAL["capacity_factor"]:
        out = replace(out, capacity_factor=NEUTRAL["capacity_factor"])
        notes.append("capacity policy none: the factor is moot")
    if d.offload_hints != "router" and (d.offload_resident_fraction >= 1 or not d.offload_prefetch_depth):
        out = replace(out, offload_hints="router")
        notes.append("nothing offloaded or prefetch depth 0: the hint source is moot")
    return out, notes


SEQS = (8, 16, 32, 64, 128, 256, 512, 1024)
NEUTRAL = {f.name: f.default for f in fields(Deployment)}  # each knob's value with its feature off


def _prune_what_if(d: Deployment, lim: Limits) -> str | None:
    if d.offload_resident_fraction < 1:
        slots = (lim.num_experts + d.redundant_experts) // max(d.ep_size, 1)
        resident = resident_slots(d, lim.num_experts)
        if resident < min(lim.top_k, slots):
            return (f"{resident} resident expert slots per rank cannot hold one token's {lim.top_k} experts "
                    f"(resident_fraction {d.offload_resident_fraction:g} of {slots})")
    return None


def to_config(base: RunConfig, d: Deployment, placement_file: str | None = None,
              loads: str | None = None) -> RunConfig:
    """The trial's RunConfig: the base recipe with the knobs set. Quant and offload knobs become
    whole `quant` / `offload` sections (`quant_section`, `offload_section`); at their neutral values
    (no low format, everything resident) the base recipe's own sections are kept. `loads`: the run
    directory whose expert loads rank hot experts (the trace); needed by a hot fraction."""
    data = base.model_dump()
    values = d.as_dict()
    for knob in default_knobs(1, 1):  # only the names and keys are used here
        section, _, name = knob.key.partition(".")
        if section in ("parallel", "engine") and recipe_accepts(knob.key) and not name.startswith("capacity_"):
            data[section][name] = values[knob.name]
    data["engine"]["speculative"] = None if d.speculative == "none" else d.speculative
    data["parallel"]["capacity_policy"] = d.capacity_policy  # at none the base's factor stays (moot)
    if d.capacity_policy != "none":
        data["parallel"]["capacity_factor"] = d.capacity_factor
    if d.placement == "eplb":
        data["parallel"]["placement"] = placement_file or "eplb"
        data["parallel"]["redundant_experts"] = 0  # the placement file carries its replicas
    elif d.placement not in ("contiguous", "round_robin"):  # a placement file given by the recipe or --space
        data["parallel"]["placement"] = d.placement
        data["parallel"]["redundant_experts"] = 0
    rpn = data["parallel"].get("ranks_per_node", 1)
    if d.ep_size % rpn and rpn % d.ep_size:
        data["parallel"]["ranks_per_node"] = min(rpn, d.ep_size)
    stored_fp8 = base.quant is not None and base.quant.experts == "fp8"  # an fp8 checkpoint's own experts
    quant = quant_section(d, loads, "fp8" if stored_fp8 else base.model.dtype)
    if quant is not None:
        data["quant"] = quant
    offload = offload_section(d, base)
    if offload is not None:
        data["offload"] = offload
    data["deploy"] = deploy_section(d, default_knobs(1, 1))  # the serving engines' knobs (None: all neutral)
    return parse_config(data, source="search trial")


QUANT_FORMATS = {"fp8": "fp8", "int8": "int8", "int4": "int4-g64"}  # knob value → moetune.quant format name


def quant_section(d: Deployment, loads: str | None, dtype: str | None) -> dict | None:
    """The `quant` section of a deployment (None: no low format). Hot experts keep the model's
    precision (bf16 / fp16 when the recipe says so, fp8 for an fp8 checkpoint's experts, else fp32);
    int4 is group-wise, group 64."""
    dense = {"dense": dense_quant(d)} if dense_quant(d) else {}  # this-machine's dense int8 / int4 (machine_space.py)
    if d.quant_low_format == "none":
        return dense or None
    low = QUANT_FORMATS[d.quant_low_format]
    if not d.quant_hot_fraction:
        return {"experts": low, **dense}
    if loads is None:
        raise MoetuneError("a quant hot fraction needs the run directory whose expert loads rank the experts")
    high = dtype if dtype in ("bf16", "fp16", "fp8") else "fp32"
    return {"hot_fraction": d.quant_hot_fraction, "high": high, "low": low, "loads": str(loads), **dense}


def offload_section(d: Deployment, base: RunConfig) -> dict | None:
    """The `offload` section of a deployment (None: every expert resident). The resident count is
    written out (`resident_slots`), so that the engine and the simulator keep the same number."""
    if d.offload_resident_fraction >= 1:
        return None
    return {"resident_experts": resident_slots(d, _num_experts(base)), "policy": d.offload_eviction,
            "prefetch_depth": d.offload_prefetch_depth, "tier": "host", "hints": d.offload_hints}


def what_if_values(d: Deployment) -> dict:
    """The knobs RunConfig does not take yet, with their values (for comments and reports)."""
    values = d.as_dict()
    return {k.key: values[k.name] for k in default_knobs(1, 1) if not recipe_accepts(k.key)}


def from_config(cfg: RunConfig, **what_if) -> Deployment:
    """The deployment a recipe describes: parallel and engine keys, its quant and offload sections
    where a knob can say them (a precision table or an explicit resident count that is no fraction
    of the knobs' grid is read as its nearest knob value), and keyword overrides."""
    p, e = cfg.parallel, cfg.engine
    placement, redundant = p.placement, p.redundant_experts
    if placement not in ("contiguous", "round_robin"):  # a placement file: its own replicas
        from moetune.moe.placement import read_placement

        redundant = read_placement(p.placement).redundant
    names = {f.name for f in fields(Deployment)}
    extra = {**deploy_values(cfg, default_knobs(1, 1)), **_sections_as_knobs(cfg, redundant), "tp_size": p.tp_size,
             "expert_tp_size": p.expert_tp, **named_values(cfg),
             **{k: v for k, v in what_if.items() if k in names and v is not None}}
    return Deployment(p.ep_size, redundant, placement, e.max_num_seqs, e.max_num_batched_tokens, **extra)


def named_values(cfg: RunConfig) -> dict:
    """The NAMED_ONLY knobs' values a recipe says (a factor without a policy: the neutral factor)."""
    p = cfg.parallel
    factor = p.capacity_factor if p.capacity_policy != "none" and p.capacity_factor else NEUTRAL["capacity_factor"]
    return {"capacity_policy": p.capacity_policy, "capacity_factor": float(factor),
            "scheduling": cfg.engine.scheduling, "speculative": cfg.engine.speculative or "none",
            "offload_hints": cfg.offload.hints if cfg.offload is not None else NEUTRAL["offload_hints"]}


def _sections_as_knobs(cfg: RunConfig, redundant: int) -> dict:
    out: dict = {}
    q = cfg.quant
    if q is not None and q.dense:
        out["dense_format"] = dense_knob(q.dense)
    if q is not None and (q.experts or q.hot_fraction is not None):
        low = q.experts if q.experts else q.low
        kind = next((k for k, v in QUANT_FORMATS.items() if v == low or (k == "int4" and low.startswith("int4"))), None)
        if kind is not None:
            out.update(quant_low_format=kind, quant_hot_fraction=float(q.hot_fraction or 0.0))
    o = cfg.offload
    if o is not None:
        if o.resident_fraction is not None:
            out["offload_resident_fraction"] = float(o.resident_fraction)
        else:  # a count: the knob value that gives it (as `offload_section` wrote it), else the plain ratio
            E = _num_experts(cfg)
            slots = (E + redundant) // max(cfg.parallel.ep_size, 1)
            same = [f for f in (1.0, 0.75, 0.5, 0.25) if resident_slots(
                Deployment(cfg.parallel.ep_size, redundant, offload_resident_fraction=f), E) == o.resident_experts]
            out["offload_resident_fraction"] = same[0] if same else min(1.0, o.resident_experts / slots)
        out.update(offload_prefetch_depth=o.prefetch_depth,
                   offload_eviction=o.policy if o.policy in ("lru", "lfu") else "lru")
    return out


def _num_experts(cfg: RunConfig) -> int:
    from moetune.model.registry import resolve_model
    from moetune.model.validate import read_spec

    return read_spec(resolve_model(cfg.model.path)).moe.num_experts


def runnable_formats(space: Space, backend: str, explicit: bool) -> Space:
    """The space with the low formats the kernel backend computes (a this-machine search proposes
    only what runs here: its winner serves); `explicit`: the --space file named the formats, so a
    format the backend lacks is the user's mistake, said in one line."""
    from moetune.quant.names import backend_formats

    allowed = backend_formats(backend)
    out = []
    for knob in space.knobs:
        if knob.name == "quant_low_format":
            bad = [v for v in knob.values if v != "none" and QUANT_FORMATS[v] not in allowed]
            if bad and explicit:
                raise SpaceError(f"--space: quant_low_format {bad[0]}: this machine's kernel backend '{backend}' "
                                 f"cannot compute it (it takes: {', '.join(sorted(allowed))})")
            knob = replace(knob, values=tuple(v for v in knob.values if v not in bad))
        out.append(knob)
    return Space(tuple(out))
