"""`moetune serve`: an OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn)."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import ModelArgs, apply_threads, model_options


@model_options("ep", "tp", "spec")
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="Address to listen on (default: recipe, else 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default: recipe, else 8000; 0 = any free port)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on /v1/*."),
    max_queue: Optional[int] = typer.Option(None, "--max-queue", help="Sequences queued beyond --max-num-seqs; "
                                                                      "more get 429 (default: recipe, else 256)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Sequences running at once."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens",
                                                         help="Tokens computed per engine step."),
    scheduling: Optional[str] = typer.Option(None, "--scheduling", help="Admission order: fcfs (default) or "
                                             "affinity (requests whose experts the step already wakes first)."),
    affinity_max_wait: Optional[int] = typer.Option(None, "--affinity-max-wait", help="Under affinity: steps a "
                                                    "request may wait beyond its FCFS admission (default 8)."),
    stream_interval: Optional[int] = typer.Option(None, "--stream-interval", min=1, help="Engine steps between two "
                                                  "hand-overs of a request's new tokens to the HTTP front end "
                                                  "(default: auto, chosen at start and logged)."),
    m: ModelArgs = ModelArgs(),
) -> None:
    """Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions), with /metrics."""
    from moetune.config import parse_config
    from moetune.serve.server import run_server

    cfg = m.config()
    serve_over = {"host": host, "port": port, "max_queue": max_queue, "stream_interval": stream_interval}
    engine_over = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                   "scheduling": scheduling, "affinity_max_wait": affinity_max_wait}
    data = cfg.model_dump()
    data["serve"].update({k: v for k, v in serve_over.items() if v is not None})
    data["engine"].update({k: v for k, v in engine_over.items() if v is not None})
    cfg = parse_config(data, source="command line")
    if cfg.parallel.world > 1:  # ep_size × G ranks, one thread each on the CPU (engine/ep_launch.py)
        from moetune.serve.rank_server import run_rank_server

        run_rank_server(cfg, api_key)
        return
    apply_threads(cfg)
    run_server(cfg, api_key)
