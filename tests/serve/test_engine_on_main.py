"""`moetune serve`'s layout on one rank (serve/engine_on_main.py): the engine's loop on the main thread,
where the model was built, uvicorn beside it, and SIGTERM forwarded to the drain."""

import os
import signal
import threading

import httpx

from moetune.config import parse_config


def test_the_engine_steps_on_the_main_thread_and_a_sigterm_ends_both_threads():
    from moetune.serve.engine_on_main import serve_on_main
    from moetune.serve.server import CleanExitServer, bind, build_server, uvicorn_config

    assert threading.current_thread() is threading.main_thread()  # pytest runs tests there
    cfg = parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}})
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    built = build_server(cfg, None)
    uv = CleanExitServer(uvicorn_config(built.app, "warning", cfg.serve), built.state, cfg.serve.drain_timeout_s)
    seen: dict = {}
    before = signal.getsignal(signal.SIGTERM)

    def client() -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                while not uv.started:
                    threading.Event().wait(0.05)
                seen["health"] = http.get("/health").status_code
                seen["answer"] = http.post("/v1/completions", json={"model": built.state.model_name, "prompt": "def f(x):",
                                                                    "max_tokens": 8, "temperature": 0}).json()
            seen["thread"] = built.state.worker.call(lambda engine: threading.current_thread().name).result(30)
            seen["steps"] = built.state.worker.snapshot.steps
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler on the main thread

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    serve_on_main(uv, built.state.worker, [sock])
    thread.join(10)
    assert seen["health"] == 200
    assert seen["answer"]["usage"]["completion_tokens"] == 8
    assert seen["thread"] == threading.main_thread().name and seen["steps"] > 0
    assert not built.state.worker.healthy  # the loop ended: the app's shutdown stopped it
    assert signal.getsignal(signal.SIGTERM) is before  # the forwarding handler is gone again
    assert [t.name for t in threading.enumerate() if t.name in ("moetune-http", "moetune-engine")] == []
