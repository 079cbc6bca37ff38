"""`moetune serve`: load the model, wire engine worker + metrics + recorder into the app, run uvicorn
beside the engine's loop (the loop on the main thread, uvicorn on a second one: engine_on_main.py).

SIGTERM (or Ctrl-C): the server stops accepting, gives in-flight requests serve.drain_timeout_s to
finish, aborts the rest with 503 / a final SSE error event (shutdown.py), then uvicorn shuts down
with nothing left to cancel; exit status 0. A second SIGTERM or Ctrl-C aborts what still runs at
once (the same 503s and final events); exit status 0 too. An engine that failed and could not be reset stops the
server the same way and exits 1 with one line, for a supervisor to restart it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass

import uvicorn

from moetune.config import RunConfig, ServeConfig
from moetune.errors import MoetuneError
from moetune.serve.engine_on_main import serve_on_main
from moetune.serve.shutdown import DrainingServer, stop_after_grace


@dataclass
class Server:
    app: object  # FastAPI
    state: object  # ServerState
    stream_interval: str = "1 step"  # the engine steps between token hand-overs, and why (serve/stream_interval.py)
    warmup: str = "no warm-up"  # what the warm-up before listening took (serve/warmup.py)


def build_server(cfg: RunConfig, api_key: str | None = None) -> Server:
    import torch

    from moetune.engine.build import build_generator
    from moetune.engine.target import resolve_target
    from moetune.engine.threads import available_cores
    from moetune.serve.fairness import SlotGate
    from moetune.serve.stream_interval import choose_interval
    from moetune.serve.warmup import warm_engine
    from moetune.serve.worker import EngineWorker

    target = resolve_target(cfg)
    generator = build_generator(target)  # once: the checkpoint checked, device and dtype
    warmed = warm_engine(generator.engine) if cfg.serve.warmup else None  # on the thread that will step it
    interval, why = choose_interval(cfg.serve.stream_interval, target.device.type, torch.get_num_threads(),
                                    available_cores())

    def worker(window, qos):
        return EngineWorker(generator.engine, before_step=window.begin_step,
                            after_step=(lambda: qos.routed(window.last_ids)) if qos else None, qos=qos,
                            gate=SlotGate.of(cfg.serve, cfg.engine.max_num_seqs), stream_interval=interval)

    server = assemble_server(cfg, api_key, generator, worker)
    server.stream_interval = f"{interval} step{'s' if interval > 1 else ''} ({why})"
    if warmed is not None:
        server.warmup = warmed.line()
    return server


def assemble_server(cfg: RunConfig, api_key: str | None, generator, make_worker, window=None,
                    replicas: int = 1, load=None) -> Server:
    """The app around a built generator: `make_worker(window, qos)` gives the engine's driver (one
    rank's EngineWorker, or rank 0's RanksWorker over `replicas` ranks, serve/rank_server.py);
    `load`: the expert load /metrics shows (default: this process's window)."""
    from moetune.engine.tokenizer import load_tokenizer
    from moetune.model.registry import resolve_model
    from moetune.serve.app import build_app
    from moetune.serve.expert_load import ExpertLoadWindow
    from moetune.serve.metrics import ServeMetrics
    from moetune.serve.recording import Recorder
    from moetune.serve.state import ServerState
    from moetune.serve.tenants import TenantLimiter

    model_dir = resolve_model(cfg.model.path)
    model = generator.model
    if window is None:
        window = ExpertLoadWindow(model, cfg.serve.metrics_window_steps)
        model.attach_probe(window)
    spec = model.spec
    shares = {name: t.expert_share for name, t in cfg.serve.tenants.items() if t.expert_share is not None}
    qos = None
    if shares:
        from moetune.serve.qos import ExpertQoS

        qos = ExpertQoS(shares, len(spec.moe_layers), spec.moe.num_experts, spec.moe.router.top_k,
                        cfg.serve.expert_capacity_factor)
    worker = make_worker(window, qos)
    flops_per_token = len(spec.moe_layers) * spec.moe.router.top_k * 6 * spec.hidden_size * spec.moe.intermediate_size
    metrics = ServeMetrics(worker.snapshot, load or window)
    if qos is not None:
        qos.on_defer = lambda tenant: metrics.deferred.labels(tenant).inc()
    state = ServerState(
        config=cfg, generator=generator, worker=worker, window=window,
        metrics=metrics, recorder=Recorder(cfg, worker, window, model_dir),
        tenants=TenantLimiter(cfg.serve.tenants), model_name=cfg.serve.model_name or model_dir.name,
        api_key=resolve_api_key(cfg, api_key), expert_flops_per_token=flops_per_token, replicas=replicas,
    )
    return Server(build_app(state, load_tokenizer(model_dir)), state)


def resolve_api_key(cfg: RunConfig, flag: str | None) -> str | None:
    if flag is not None:
        if not flag:
            raise MoetuneError("--api-key must not be empty")
        return flag
    name = cfg.serve.api_key_env
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise MoetuneError(f"serve.api_key_env names ${name}, which is unset or empty; export it or pass --api-key")
    return key


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise MoetuneError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port or --host") from None
    return sock


def run_server(cfg: RunConfig, api_key: str | None = None) -> None:
    sock = bind(cfg.serve.host, cfg.serve.port)  # a taken port fails before the model loads
    server = build_server(cfg, api_key)
    host, port = sock.getsockname()[:2]
    from moetune.engine.threads import wait_policy

    print(f"moetune serve: {server.state.model_name} on http://{host}:{port} "
          f"(OpenAI API under /v1; SIGTERM or Ctrl-C stops; stream interval: {server.stream_interval}; "
          f"{server.warmup}; OpenMP wait: {wait_policy()})", file=sys.stderr, flush=True)
    uv = CleanExitServer(uvicorn_config(server.app, "info", cfg.serve), server.state, cfg.serve.drain_timeout_s)

    def fatal(reason: str) -> None:  # on the engine thread
        stop_after_grace(uv, server.state)

    server.state.worker.on_fatal = fatal
    serve_on_main(uv, server.state.worker, [sock])  # the engine steps on this thread (engine_on_main.py)
    if server.state.worker.failure is not None:
        raise MoetuneError(f"the engine failed ({server.state.worker.failure}); exiting non-zero so that a "
                           "supervisor restarts the server")


def uvicorn_config(app, log_level: str, serve: ServeConfig | None = None) -> uvicorn.Config:
    """uvicorn's settings: h11 with the request head guarded (http11.py: 431 over 16 KiB, 408 past
    serve.head_timeout_s, serve.slow_heads_per_client); its own graceful timeout is a backstop only
    (the drain of shutdown.py comes first)."""
    from moetune.serve.http11 import HeadGuardProtocol, HeadLimits, SlowHeads

    serve = serve or ServeConfig()
    limits = HeadLimits(timeout_s=serve.head_timeout_s, per_client=serve.slow_heads_per_client)
    protocol = functools.partial(HeadGuardProtocol, limits=limits, slow=SlowHeads())
    return uvicorn.Config(app, log_level=log_level, access_log=False, http=protocol,
                          h11_max_incomplete_event_size=limits.max_bytes, timeout_graceful_shutdown=5)


class CleanExitServer(DrainingServer):
    """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, so the process would die of the
    signal; a server asked to stop that stopped cleanly exits 0 instead."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
