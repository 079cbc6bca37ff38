"""`moetune serve` over a mesh of ranks (parallel.ep_size R × G tensor-parallel ranks, world > 1;
spawned here, or torchrun's), rank 0 the HTTP front end.

Every rank builds its share of the model (engine/distributed.py `build_rank`: its expert slots and
weight slices), a live expert-load window of its own and the serving loop's gloo group; then rank 0
serves HTTP (the app of one rank, driven by a RanksWorker, serve/rank_worker.py) while the others
follow its lock-steps (serve/ranks.py). Requests go to the R data-parallel groups; the G ranks of
a group step alike on the same requests and its TP rank 0 reports for it. Shutdown (SIGTERM, Ctrl-C) drains on rank 0 as with one rank, then rank 0 tells
every rank to stop; the command exits 0. A rank that dies fails the server: new requests get 503,
in-flight ones an error, uvicorn stops, and rank 0 raises the collective's error, which the
launcher turns into one line naming the rank (exit 1); the spawned ranks are stopped with it.
"""

from __future__ import annotations

import sys

from moetune.config import RunConfig
from moetune.errors import MoetuneError


class ServeJob:
    """Run on every rank (picklable: spawned ranks get it without rank 0's listening socket)."""

    def __init__(self, cfg: RunConfig, api_key: str | None, sock=None):
        self.cfg, self.api_key, self.sock = cfg, api_key, sock

    def __getstate__(self) -> dict:
        return {**self.__dict__, "sock": None}

    def __call__(self, dp) -> None:
        from moetune.serve.expert_load import ExpertLoadWindow
        from moetune.serve.ranks import RankSide, control_group, follow

        window = ExpertLoadWindow(dp.model, self.cfg.serve.metrics_window_steps)
        dp.model.attach_probe(window)
        side = RankSide(dp, window, control_group())
        if dp.rank != 0:
            follow(side)
            return
        serve_rank0(self.cfg, self.api_key, self.sock, side)


def serve_rank0(cfg: RunConfig, api_key: str | None, sock, side) -> None:
    from moetune.engine.target import resolve_placement
    from moetune.serve.rank_metrics import RankCollector, RanksLoad
    from moetune.serve.rank_recording import RankRecorder
    from moetune.serve.fairness import SlotGate
    from moetune.serve.rank_worker import RanksWorker
    from moetune.serve.server import CleanExitServer, assemble_server, uvicorn_config
    from moetune.serve.shutdown import stop_after_grace

    live: dict = {}  # the state and the uvicorn server, once built

    def on_failure(exc: BaseException) -> None:  # on the worker's thread: new requests 503, then stop
        if "server" in live:
            stop_after_grace(live["server"], live["state"])
        else:
            live["state"].draining = True

    worker = RanksWorker(side, on_failure, SlotGate.of(cfg.serve, cfg.engine.max_num_seqs * side.dp_size))
    spec = side.dp.model.spec
    placement = resolve_placement(cfg.parallel, spec)  # None at ep_size 1 (every expert on every group)
    load = RanksLoad(worker, list(spec.moe_layers), spec.moe.num_experts)
    built = assemble_server(cfg, api_key, side.dp.generator, lambda window, qos: worker, window=side.window,
                            replicas=side.dp_size, load=load)
    state = live["state"] = built.state
    old = state.recorder
    state.recorder = RankRecorder(cfg, worker, side.window, old.model_dir)

    state.metrics.registry.register(RankCollector(worker, placement))
    host, port = sock.getsockname()[:2]
    print(f"moetune serve: {state.model_name} on http://{host}:{port} over {describe_ranks(cfg)} "
          f"(OpenAI API under /v1; SIGTERM or Ctrl-C stops)", file=sys.stderr, flush=True)
    server = live["server"] = CleanExitServer(uvicorn_config(built.app, "info", cfg.serve), state,
                                              cfg.serve.drain_timeout_s)
    server.run(sockets=[sock])
    if worker.error is not None:
        raise worker.error  # the launcher names the rank that failed
    state.worker.stop()  # (the app's shutdown stopped it already; a no-op then)


def describe_ranks(cfg: RunConfig) -> str:
    p = cfg.parallel
    if p.group_size == 1:
        return f"{p.ep_size} expert-parallel ranks"
    return (f"{p.world} ranks ({p.ep_size} data-parallel group{'s' if p.ep_size > 1 else ''} × {p.group_size} "
            f"tensor-parallel: tp_size {p.tp_size}, expert_tp_size {p.expert_tp})")


def check_serving(cfg: RunConfig) -> None:
    """What a multi-rank server cannot do (yet), refused with one line before any rank starts."""
    if any(t.expert_share is not None for t in cfg.serve.tenants.values()):
        p = cfg.parallel
        raise MoetuneError("serve.tenants.*.expert_share (expert QoS) schedules one engine; it is not available "
                           f"with parallel.ep_size={p.ep_size}, tp_size={p.tp_size}, expert_tp_size={p.expert_tp} "
                           "— drop expert_share or serve on one rank")


def run_rank_server(cfg: RunConfig, api_key: str | None) -> None:
    from moetune.engine.torchrun import launching_rank
    from moetune.serve.server import bind, resolve_api_key

    check_serving(cfg)  # before torch loads (engine/distributed.py)
    from moetune.engine.distributed import run_ranks

    sock = None
    if launching_rank() == 0:
        resolve_api_key(cfg, api_key)  # a missing key fails before any rank starts
        sock = bind(cfg.serve.host, cfg.serve.port)  # so does a taken port
    run_ranks(cfg, ServeJob(cfg, api_key, sock))
