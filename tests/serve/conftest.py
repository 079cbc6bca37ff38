"""A real `moetune serve` app on a free localhost port, run by uvicorn in a background thread."""

import threading
import time
from dataclasses import dataclass

import pytest

from moetune.config import parse_config

API_KEY = "sk-test-key"


@dataclass
class Running:
    url: str
    state: object  # ServerState: tests peek at the engine through it

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", API_KEY), max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)

    @property
    def model(self) -> str:
        return self.state.model_name


def start_server(config: dict, api_key: str | None = API_KEY):
    """→ (Running, stop): the bundled model behind uvicorn on 127.0.0.1:<free port>."""
    from moetune.serve.server import bind, build_server, uvicorn_config
    from moetune.serve.shutdown import DrainingServer

    cfg = parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}, **config})
    sock = bind("127.0.0.1", 0)
    built = build_server(cfg, api_key)
    server = DrainingServer(uvicorn_config(built.app, "warning"), built.state, cfg.serve.drain_timeout_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(30)

    return Running(f"http://127.0.0.1:{sock.getsockname()[1]}", built.state), stop


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    running, stop = start_server({"engine": {"max_num_seqs": 16},
                                  "serve": {"max_queue": 64, "record_dir": str(tmp_path_factory.mktemp("runs")),
                                            "max_body_bytes": 64 * 1024,
                                            "tenants": {"tiny": {"tokens_per_s": 1, "burst_tokens": 40}}}})
    yield running
    stop()


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
