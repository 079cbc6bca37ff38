"""A stand-in serving engine for the engine evaluator's tests: a real HTTP server (standard library)
with vLLM's command line (`vllm serve MODEL --flag value ...`), /health, /v1/models and a streaming
/v1/completions that generates `max_tokens` tokens. Like vLLM it forks a helper process (its "engine
core"), so that a test can check the whole process group goes.

FAKE_ENGINE_MODE: ok (default) | never_healthy (/health answers 503) | exit (prints an error and
exits 1 before serving) | slow (each token takes FAKE_ENGINE_TOKEN_S seconds).
FAKE_ENGINE_REJECT: a flag it refuses like argparse does. FAKE_ENGINE_PIDS: a file it appends its
own and its helper's pid to.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse(argv):
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("command")
    p.add_argument("model")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    reject = os.environ.get("FAKE_ENGINE_REJECT")
    known, rest = p.parse_known_args(argv)
    if reject and reject in rest:
        p.error(f"unrecognized arguments: {reject}")
    return known


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def _json(self, code, data):
        body = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json(503 if os.environ.get("FAKE_ENGINE_MODE") == "never_healthy" else 200, {})
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": "fake-model"}]})
        else:
            self._json(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        n_in = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        delay = float(os.environ.get("FAKE_ENGINE_TOKEN_S", "0.002"))
        if os.environ.get("FAKE_ENGINE_MODE") != "slow":
            delay = 0.002
        for _ in range(body["max_tokens"]):
            time.sleep(delay)
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            self.wfile.flush()
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"], "prompt_tokens": n_in}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


def main():
    args = parse(sys.argv[1:])
    mode = os.environ.get("FAKE_ENGINE_MODE", "ok")
    print(f"fake engine: loading {args.model}", flush=True)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    pids = os.environ.get("FAKE_ENGINE_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n{helper.pid}\n")
    if mode == "exit":
        print("fake engine: RuntimeError: out of memory while allocating the KV cache", flush=True)
        sys.exit(1)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"fake engine: serving on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
