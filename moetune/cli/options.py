"""The option vocabulary: every option two commands share is defined here once, and added to a command
by a decorator (`model_options`, `trace_options`) so that the commands cannot drift apart.

A decorated command declares one parameter for the whole set (`m: ModelArgs`, `w: TraceArgs`); the
decorator shows typer the set's options in its place and hands the values over as that one object.
Booleans are `--flag/--no-flag` everywhere.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Optional

import typer

def flag(default: bool, name: str, help: str = ""):
    """A boolean option: `--name/--no-name`, shown without a value (it takes none)."""
    return typer.Option(default, f"{name}/--no-{name[2:]}", metavar="", help=help)


ModelOpt = typer.Option(None, "--model", "-m", help="Checkpoint directory or bundled model name (default: stdlib-moe).")
RecipeOpt = typer.Option(None, "--recipe", "-r", help="Recipe YAML (recipes/*.yaml); flags override it.")
DtypeOpt = typer.Option(None, "--dtype", help="fp32 | bf16 | fp16 (default: fp32 on CPU, bf16 on CUDA).")
DeviceOpt = typer.Option(None, "--device", help="cpu | cuda | cuda:N (default: cuda if present).")
BackendOpt = typer.Option(None, "--kernel-backend", help="torch | cpu | triton (default: triton on CUDA, cpu "
                                                          "elsewhere: the numba decode kernels).")
ThreadsOpt = typer.Option(None, "--threads", min=1, help="CPU threads for torch and the CPU kernels (default: recipe, "
                                                  "else the cores this process may use).")

EpSizeOpt = typer.Option(None, "--ep-size", help="Expert-parallel ranks R (default: recipe, else 1); spawns R "
                                                 "processes, or joins torchrun's group.")
TpSizeOpt = typer.Option(None, "--tp-size", help="Tensor-parallel ranks G: attention, dense MLPs, embedding and LM "
                                                 "head split G ways (default: recipe, else 1); with --ep-size R runs "
                                                 "R × G ranks.")
ExpertTpSizeOpt = typer.Option(None, "--expert-tp-size", help="Split each expert's intermediate dim over the G ranks "
                                                               "(1 or G; default: recipe, else --tp-size).")
SpeculativeOpt = typer.Option(None, "--speculative", help="Speculative decoding: ngram:K drafts up to K tokens per "
                                                           "decode from the sequence's own earlier tokens, "
                                                           "draft:DIR:K from a smaller checkpoint with the same "
                                                           "vocabulary, mtp:K from the checkpoint's own MTP layer "
                                                           "(num_nextn_predict_layers); one step verifies them; "
                                                           "':auto' after K (ngram:4:auto) picks k in 0..K per "
                                                           "step from the measured acceptance and the batch size "
                                                           "(default: recipe, else off).")
PlacementOpt = typer.Option(None, "--placement", help="contiguous | round_robin | a JSON from `moetune placement`.")
RedundantOpt = typer.Option(None, "--redundant-experts", help="Extra physical slots N for replicas of hot experts.")

TraceOpt = typer.Option(..., "--trace", "-t", help="Run directory of `moetune profile` (its routing trace and "
                                                  "workload).")
HardwareOpt = typer.Option("this-machine", "--hardware", help="H100 | H200 | B200 | NxH200 | this-machine | a YAML "
                                                              "file.")
NodesOpt = typer.Option(None, "--nodes", help="Nodes of the hardware (default: 1, or from NxGPU).")
ScaleModelOpt = typer.Option(None, "--scale-model", help="config.json of a larger model to replay the routing on.")
ScaleRoutingOpt = typer.Option(None, "--scale-routing", help="How --scale-model carries the routing over: stats "
                               "(default: each layer's load CV kept, hot experts at random ids), blocks (each source "
                               "expert a block of target experts: the toy's skew), balanced (every expert equally loaded: the peer "
                               "tools' uniform routing) | loads:FILE (a real deployment's "
                               "per-layer loads: SGLang's expert-distribution .pt dump, stat or per_token mode, or a moetune run "
                               "directory; vLLM writes no load file).")
EngineOpt = typer.Option(None, "--engine", help="vllm | sglang: the serving engine whose measured op tables price "
                        "the GPU ops (default vllm; the gpu-db extra: pip install \"moetune[gpu-db]\"; without it, or "
                        "on hardware the tables lack, the roofline, labelled 'roofline (unmeasured)'); search: also "
                        "the engine `--evaluator engine` and `--remeasure-on` run.")
EngineVersionOpt = typer.Option(None, "--engine-version", help="The engine version of the measured tables "
                                "(default: the tables' current one; also current | previous | next).")
NumRequestsOpt = typer.Option(None, "--num-requests", help="Requests (default: the run's).")
InputLenOpt = typer.Option(None, "--input-len", help="Prompt tokens (default: the run's).")
OutputLenOpt = typer.Option(None, "--output-len", help="Output tokens (default: the run's).")
CalibrateOnOpt = typer.Option("microbenchmarks", "--calibrate-on", help="this-machine: microbenchmarks (timed now, "
                              "cached per machine) | trace (the trace's own phase times) | engine (search: the "
                              "estimates corrected per phase class by the trials measured on an engine in --out).")
SpecAcceptanceOpt = typer.Option(None, "--spec-acceptance", min=0.0, max=1.0,
                                 help="Speculation priced without a measured acceptance (the trace not profiled "
                                      "with that speculator): per-token acceptance 0..1, labelled assumed.")
RecalibrateOpt = flag(False, "--recalibrate", help="this-machine: measure the microbenchmarks again even "
                                                           "when cached.")
ReferenceTrialsOpt = flag(True, "--reference-trials", help="A new study runs reference deployments first "
                          "(the most replicas that fit; EP over a node and over every GPU with fp8 and EPLB; a TP "
                          "group where the space searches one), counted in --n-trials; not with --sampler grid.")
# how a command's tables reach stdout (moetune/report/terminal.py)
OutputFormatOpt = typer.Option("text", "--format", help="text (a table on a terminal; piped: one line per row) | "
                                                        "tsv (tab-separated rows, a blank line between tables; "
                                                        "other lines to stderr).")
# the workload of `simulate` and `search` (search/cost/schedule.py, steady.py); default: a burst
ConcurrencyOpt = typer.Option(None, "--concurrency", help="Steady state, closed loop: C requests in flight per "
                                                          "deployment replica (a finished one is replaced at once).")
RateOpt = typer.Option(None, "--request-rate", help="Steady state, open loop: Poisson arrivals at R requests/s per "
                                                   "deployment replica (seeded by --arrival-seed).")
WarmupOpt = typer.Option(None, "--warmup-requests", help="Requests excluded from the steady-state figures at each "
                                                         "end (default: C, or a fifth at a rate).")
ArrivalSeedOpt = typer.Option(0, "--arrival-seed", help="Seed of the Poisson arrivals.")
SloTtftOpt = typer.Option(None, "--slo-ttft-ms", help="Goodput: a request's TTFT limit (ms).")
SloTpotOpt = typer.Option(None, "--slo-tpot-ms", help="Goodput: a request's TPOT limit (ms).")
SloPercentileOpt = typer.Option(90.0, "--slo-percentile", help="The percentile of the steady window's requests the "
                                "SLOs apply at (default 90). On GPU hardware with an SLO and no --concurrency / "
                                "--request-rate / --burst, each deployment runs the highest concurrency meeting them.")
BurstOpt = flag(False, "--burst", help="Every request at t=0 (the default on this-machine; on GPU hardware the "
                "default is the steady state: the load the SLOs allow, else --concurrency 256 per replica).")
UnstaggeredOpt = flag(False, "--unstaggered", help="A simulated closed loop's first C requests all join at t=0 and "
                      "run in synchronized waves (default: staggered, joining spread over one output: the steady "
                      "state a server runs in). With --concurrency or the load the SLOs allow.")


def run_config(model: Optional[str], recipe: Optional[str], dtype: Optional[str] = None,
               device: Optional[str] = None, kernel_backend: Optional[str] = None, ep_size: Optional[int] = None,
               placement: Optional[str] = None, redundant_experts: Optional[int] = None,
               threads: Optional[int] = None, tp_size: Optional[int] = None, expert_tp_size: Optional[int] = None,
               speculative: Optional[str] = None):
    """Recipe (or defaults) with command-line flags applied on top."""
    from moetune.cli.checks import recipe_file
    from moetune.config import RunConfig, load_recipe, parse_config

    if recipe:
        recipe_file(recipe)
    cfg = load_recipe(recipe) if recipe else RunConfig()
    overrides = {"path": model, "dtype": dtype, "device": device, "kernel_backend": kernel_backend, "threads": threads}
    model_section = {**cfg.model.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
    par = {"ep_size": ep_size, "placement": placement, "redundant_experts": redundant_experts, "tp_size": tp_size,
           "expert_tp_size": expert_tp_size}
    parallel = {**cfg.parallel.model_dump(), **{k: v for k, v in par.items() if v is not None}}
    engine = {**cfg.engine.model_dump(), **({"speculative": speculative} if speculative is not None else {})}
    return parse_config({**cfg.model_dump(), "model": model_section, "parallel": parallel, "engine": engine},
                        source="command line")


def checked_config(model: Optional[str], recipe: Optional[str], dtype: Optional[str] = None,
                   device: Optional[str] = None, kernel_backend: Optional[str] = None, ep_size: Optional[int] = None,
                   placement: Optional[str] = None, redundant_experts: Optional[int] = None,
                   threads: Optional[int] = None, tp_size: Optional[int] = None, expert_tp_size: Optional[int] = None,
                   speculative: Optional[str] = None):
    """`run_config` plus the checks a config needs before anything is loaded (a known device)."""
    from moetune.cli import checks

    cfg = run_config(model, recipe, dtype, device, kernel_backend, ep_size, placement, redundant_experts, threads,
                     tp_size, expert_tp_size, speculative)
    checks.device(cfg.model.device)
    checks.quant_formats(cfg.quant)
    return cfg


def apply_threads(cfg) -> None:
    """Set the process's CPU threads (torch and the CPU kernels) once, before a model is loaded."""
    from moetune.engine.threads import use_threads

    use_threads(cfg.model.threads)


@dataclass(frozen=True)
class ModelArgs:
    """The model-loading options of a command (those its decorator added; the rest stay None)."""

    model: Optional[str] = None
    recipe: Optional[str] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    kernel_backend: Optional[str] = None
    threads: Optional[int] = None
    ep_size: Optional[int] = None
    placement: Optional[str] = None
    redundant_experts: Optional[int] = None
    tp_size: Optional[int] = None
    expert_tp_size: Optional[int] = None
    speculative: Optional[str] = None

    def config(self, **override):
        """The recipe (or defaults) with these flags on top (`override`: e.g. ep_size=None for profile)."""
        return run_config(**{**self._args(), **override})

    def checked(self, **override):
        """`config` plus the checks before anything loads (a known device, known quant formats)."""
        return checked_config(**{**self._args(), **override})

    def _args(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class TraceArgs:
    """The trace and workload options of `simulate` and `search` (search/study/setup.py Inputs)."""

    trace: str
    recipe: Optional[str] = None
    hardware: str = "this-machine"
    nodes: Optional[int] = None
    scale_model: Optional[str] = None
    scale_routing: Optional[str] = None
    num_requests: Optional[int] = None
    input_len: Optional[int] = None
    output_len: Optional[int] = None
    concurrency: Optional[int] = None
    request_rate: Optional[float] = None
    warmup_requests: Optional[int] = None
    arrival_seed: int = 0
    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None
    slo_percentile: float = 90.0
    burst: bool = False
    unstaggered: bool = False
    calibrate_on: str = "microbenchmarks"
    recalibrate: bool = False
    spec_acceptance: Optional[float] = None
    engine: Optional[str] = None
    engine_version: Optional[str] = None

    def inputs(self):
        from moetune.search.study.setup import Inputs

        return Inputs(**{f.name: getattr(self, f.name) for f in fields(self)})


# each group: (parameter, type, option) in the order --help lists them
SOURCE = [("model", Optional[str], ModelOpt), ("recipe", Optional[str], RecipeOpt),
          ("threads", Optional[int], ThreadsOpt)]
DEVICE = [("dtype", Optional[str], DtypeOpt), ("device", Optional[str], DeviceOpt),
          ("kernel_backend", Optional[str], BackendOpt)]
EP = [("ep_size", Optional[int], EpSizeOpt), ("placement", Optional[str], PlacementOpt),
      ("redundant_experts", Optional[int], RedundantOpt)]
TP = [("tp_size", Optional[int], TpSizeOpt), ("expert_tp_size", Optional[int], ExpertTpSizeOpt)]
SPEC = [("speculative", Optional[str], SpeculativeOpt)]
GROUPS = {"source": SOURCE, "device": DEVICE, "ep": EP, "tp": TP, "spec": SPEC}
WORKLOAD = [("num_requests", Optional[int], NumRequestsOpt), ("input_len", Optional[int], InputLenOpt),
            ("output_len", Optional[int], OutputLenOpt), ("concurrency", Optional[int], ConcurrencyOpt),
            ("request_rate", Optional[float], RateOpt), ("warmup_requests", Optional[int], WarmupOpt),
            ("arrival_seed", int, ArrivalSeedOpt), ("slo_ttft_ms", Optional[float], SloTtftOpt),
            ("slo_tpot_ms", Optional[float], SloTpotOpt), ("slo_percentile", float, SloPercentileOpt),
            ("burst", bool, BurstOpt), ("unstaggered", bool, UnstaggeredOpt)]
TRACE = [("trace", str, TraceOpt), ("hardware", str, HardwareOpt), ("nodes", Optional[int], NodesOpt),
         ("scale_model", Optional[str], ScaleModelOpt), ("scale_routing", Optional[str], ScaleRoutingOpt),
         *WORKLOAD, ("calibrate_on", str, CalibrateOnOpt), ("recalibrate", bool, RecalibrateOpt),
         ("spec_acceptance", Optional[float], SpecAcceptanceOpt), ("engine", Optional[str], EngineOpt),
         ("engine_version", Optional[str], EngineVersionOpt)]


def model_options(*groups: str):
    """Add the model-loading options (--model --recipe --threads --dtype --device --kernel-backend, and the
    groups named: "ep", "tp") to a command that takes `m: ModelArgs`. `groups` may name "source" alone
    (a command that reads a checkpoint but runs nothing: quantize)."""
    chosen = [p for g in (groups if "source" in groups else ("source", "device", *groups)) for p in GROUPS[g]]
    return _shared(chosen, ModelArgs, "m")


def trace_options(recipe_help: str):
    """Add the trace, hardware and workload options to a command that takes `w: TraceArgs` (and its
    --recipe, whose meaning is the command's)."""
    recipe = ("recipe", Optional[str], typer.Option(None, "--recipe", "-r", help=recipe_help))
    return _shared([TRACE[0], recipe, *TRACE[1:]], TraceArgs, "w", first=True)


def _shared(params: list, into: type, arg: str, first: bool = False):
    def wrap(fn):
        sig = inspect.signature(fn)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != arg]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=typ)
                 for name, typ, opt in params]

        @functools.wraps(fn)
        def command(**kwargs):
            values = {name: kwargs.pop(name) for name, _, _ in params}
            return fn(**kwargs, **{arg: into(**values)})

        command.__signature__ = sig.replace(parameters=[*added, *own] if first else [*own, *added])
        command.__annotations__ = {**{k: v for k, v in fn.__annotations__.items() if k != arg},
                                   **{name: typ for name, typ, _ in params}}
        # typer reads __signature__; get_type_hints follows __wrapped__ to the command module's names
        return command

    return wrap
