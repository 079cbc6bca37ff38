"""`moetune serve`: an OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn)."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import (BackendOpt, DeviceOpt, DtypeOpt, EpSizeOpt, ModelOpt, PlacementOpt, RecipeOpt,
                                 RedundantOpt, SpeculativeOpt, ThreadsOpt, apply_threads, run_config)


def serve(
    model: Optional[str] = ModelOpt,
    recipe: Optional[str] = RecipeOpt,
    host: Optional[str] = typer.Option(None, "--host", help="Address to listen on (default: recipe, else 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default: recipe, else 8000; 0 = any free port)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on /v1/*."),
    max_queue: Optional[int] = typer.Option(None, "--max-queue", help="Sequences queued beyond --max-num-seqs; "
                                                                      "more get 429 (default: recipe, else 256)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Sequences running at once."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens",
                                                         help="Tokens computed per engine step."),
    dtype: Optional[str] = DtypeOpt,
    device: Optional[str] = DeviceOpt,
    kernel_backend: Optional[str] = BackendOpt,
    ep_size: Optional[int] = EpSizeOpt,
    placement: Optional[str] = PlacementOpt,
    redundant_experts: Optional[int] = RedundantOpt,
    threads: Optional[int] = ThreadsOpt,
    speculative: Optional[str] = SpeculativeOpt,
) -> None:
    """Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions), with /metrics."""
    from moetune.config import parse_config
    from moetune.serve.server import run_server

    cfg = run_config(model, recipe, dtype, device, kernel_backend, ep_size, placement, redundant_experts, threads,
                     speculative=speculative)
    serve_over = {"host": host, "port": port, "max_queue": max_queue}
    engine_over = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens}
    data = cfg.model_dump()
    data["serve"].update({k: v for k, v in serve_over.items() if v is not None})
    data["engine"].update({k: v for k, v in engine_over.items() if v is not None})
    cfg = parse_config(data, source="command line")
    if cfg.parallel.group_size > 1:  # the rank server hands requests to ranks, not to TP groups (yet)
        from moetune.errors import MoetuneError

        raise MoetuneError(f"moetune serve does not run tensor parallelism yet (the recipe sets parallel.tp_size="
                           f"{cfg.parallel.tp_size}, expert_tp_size={cfg.parallel.expert_tp}); set both to 1 to serve")
    if cfg.parallel.ep_size > 1:  # R ranks, one thread each on the CPU (engine/ep_launch.py)
        from moetune.serve.rank_server import run_rank_server

        run_rank_server(cfg, api_key)
        return
    apply_threads(cfg)
    run_server(cfg, api_key)
