"""`torchrun --nnodes 2 --nproc-per-node 1 ... -m moetune serve --ep-size 2`: two "nodes" on localhost
with a real c10d rendezvous; the rank that draws 0 serves HTTP and answers what one rank answers
alone; SIGTERM to it drains both and every process exits 0."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.serve.conftest import PROMPTS, alive, ask, free_port


class Node:
    def __init__(self, node_rank: int, rdzv_port: int):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--node-rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}",
             "--rdzv-id", "moetune-serve-test", "-m", "moetune", "serve", "--ep-size", "2", "--port", "0",
             "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self.reader.start()

    @property
    def url(self) -> str | None:
        found = [re.search(r"http://[0-9.]+:\d+", line) for line in list(self.lines) if "http://" in line]
        return found[0].group(0) if found else None

    def worker(self) -> int:
        """The moetune process torchrun started."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        return int(out[0])


class _Url:
    def __init__(self, url):
        self.url = url

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=180)


def test_two_torchrun_nodes_serve_as_one_rank_would(alone):
    port = free_port()
    nodes = [Node(n, port) for n in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while not any(n.url and any("startup complete" in line for line in n.lines) for n in nodes):
            assert time.monotonic() < deadline and all(n.proc.poll() is None for n in nodes), \
                "".join(nodes[0].lines + nodes[1].lines)
            time.sleep(0.2)
        front = next(n for n in nodes if n.url)
        srv = _Url(front.url)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda p: ask(srv, p, True), PROMPTS[:8]))
        assert got == alone[:8]
        workers = [n.worker() for n in nodes]
        os.kill(front.worker(), signal.SIGTERM)
        codes = [n.proc.wait(60) for n in nodes]
        assert codes == [0, 0], "".join(nodes[0].lines + nodes[1].lines)
        assert not [pid for pid in workers if alive(pid)]
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait(10)
