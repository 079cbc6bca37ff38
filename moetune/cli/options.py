"""Options shared by every command that runs a model (--model/--recipe/--dtype/--device/...)."""

from __future__ import annotations

from typing import Optional

import typer

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
                                                           "vocabulary; one step verifies them (default: recipe, "
                                                           "else off).")
PlacementOpt = typer.Option(None, "--placement", help="contiguous | round_robin | a JSON from `moetune placement`.")
RedundantOpt = typer.Option(None, "--redundant-experts", help="Extra physical slots N for replicas of hot experts.")

CalibrateOnOpt = typer.Option("microbenchmarks", "--calibrate-on", help="this-machine: microbenchmarks (timed now, "
                              "cached per machine) | trace (the trace's own phase times).")
RecalibrateOpt = typer.Option(False, "--recalibrate", help="this-machine: measure the microbenchmarks again even "
                                                           "when cached.")
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
