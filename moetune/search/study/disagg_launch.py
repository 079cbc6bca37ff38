"""Launch files of a disaggregated winner (cost/disagg.py): one command per prefill and decode worker
(each the aggregated launch of its own mesh, vllm_launch.py / sglang_launch.py, plus the engine's
disaggregation flags) and the request router, every command checked with the engine's parser
(flag_tables/: sglang.json, vllm.json with vllm_kv_transfer.json for the JSON, sglang_router.json:
sglang-router 0.3.2's RouterArgs, dumped by tools/engine_flag_tables.py).

| | SGLang | vLLM |
|---|---|---|
| prefill worker | `--disaggregation-mode prefill --disaggregation-transfer-backend nixl --disaggregation-bootstrap-port B` | `--kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}'` |
| decode worker | `--disaggregation-mode decode --disaggregation-transfer-backend nixl` | `... "kv_role": "kv_consumer"` |
| router | `python -m sglang_router.launch_router --pd-disaggregation --prefill URL B … --decode URL …` | none in vLLM's CLI: a P/D proxy (vLLM's disaggregated-serving examples, llm-d, Dynamo) |

Run the file once per worker with ROLE=prefill-k / decode-k / router on the worker's node; workers of
one role share $PREFILL_HOST / $DECODE_HOST with a port each (on separate nodes, give each its address).
"""

from __future__ import annotations

import json

from moetune.search.cost.deployment import Deployment, gpus
from moetune.search.cost.disagg import workers
from moetune.search.study.flag_table import LAUNCHERS, check, flag_table
from moetune.search.study.launch import ServeTarget, shell_args

PORT, BOOTSTRAP, ROUTER_PORT = 30000, 8998, 8000


def sglang_workers(d: Deployment, t: ServeTarget) -> list[tuple[str, str, list[str]]]:
    """(role, engine, argv) of every worker and the router."""
    from moetune.search.study.sglang_launch import sglang_launch

    pre, dec = workers(d)
    out, router = [], ["--pd-disaggregation", "--host", "0.0.0.0", "--port", str(ROUTER_PORT)]
    for k in range(d.prefill_workers):
        argv = sglang_launch(pre, t, None).nodes[0] + [
            "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl",
            "--disaggregation-bootstrap-port", str(BOOTSTRAP + k), "--host", "0.0.0.0", "--port", str(PORT + k)]
        out.append((f"prefill-{k}", "sglang", argv))
        router += ["--prefill", f"http://$PREFILL_HOST:{PORT + k}", str(BOOTSTRAP + k)]
    for k in range(d.decode_workers):
        argv = sglang_launch(dec, t, None).nodes[0] + [
            "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl", "--host", "0.0.0.0",
            "--port", str(PORT + 100 + k)]
        out.append((f"decode-{k}", "sglang", argv))
        router += ["--decode", f"http://$DECODE_HOST:{PORT + 100 + k}"]
    return out + [("router", "sglang_router", router)]


def vllm_workers(d: Deployment, t: ServeTarget) -> list[tuple[str, str, list[str]]]:
    from moetune.search.study.vllm_launch import vllm_launch

    pre, dec = workers(d)
    out = []
    for role, worker, n, kv_role, base in (("prefill", pre, d.prefill_workers, "kv_producer", PORT),
                                           ("decode", dec, d.decode_workers, "kv_consumer", PORT + 100)):
        config = json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})
        for k in range(n):
            out.append((f"{role}-{k}", "vllm", vllm_launch(worker, t).nodes[0]
                        + ["--port", str(base + k), "--kv-transfer-config", config]))
    return out


def disagg_text(engine: str, d: Deployment, t: ServeTarget, label: str, figures: dict | None) -> str:
    """The shell file of a disaggregated winner for `engine` (vllm | sglang), each command parser-checked."""
    commands = sglang_workers(d, t) if engine == "sglang" else vllm_workers(d, t)
    for role, eng, argv in commands:
        why = check(eng, argv)
        if why:  # built only from the tables' flags: a bug, not a user mistake
            raise RuntimeError(f"emitted {role} command does not parse: {why}")
    pre, dec = workers(d)
    lines = ["#!/usr/bin/env bash", f"# {flag_table(engine).title()} disaggregated prefill/decode launch of the "
             f"moetune search winner: {label}",
             f"# {d.prefill_workers} prefill worker(s) × {gpus(pre)} {t.gpu} ({pre.label()}) + {d.decode_workers} "
             f"decode worker(s) × {gpus(dec)} {t.gpu} ({dec.label()})",
             "# every command parses with its program's own argument parser (moetune/search/study/flag_tables/)",
             *([f"# run the whole set {d.replicas} times (one per replica, each on its own GPUs) behind a load balancer"]
               if d.replicas > 1 else []),
             "# run once per worker: ROLE=prefill-0 | ... | decode-0 | ..." + (" | router" if engine == "sglang" else "")]
    if figures:
        lines.append("# estimated: " + ", ".join(f"{k} {figures[k]:.4g}" for k in ("output_tok_s", "output_tok_s_per_gpu",
                                                                                 "ttft_ms", "tpot_ms") if k in figures))
    if engine == "vllm":
        lines.append("# requests go through a P/D proxy that sends each to a prefill then a decode worker (vLLM's CLI "
                     "has none: vLLM's disaggregated-serving examples, llm-d or Dynamo)")
    lines += ["set -euo pipefail", 'ROLE="${ROLE:?prefill-K, decode-K or router}"',
              'MODEL_DIR="${MODEL_DIR:?the model: its Hugging Face id or a local directory}"',
              'PREFILL_HOST="${PREFILL_HOST:-127.0.0.1}"', 'DECODE_HOST="${DECODE_HOST:-127.0.0.1}"']
    for role, eng, argv in commands:
        lines += ["", f'if [ "$ROLE" = {role} ]; then', LAUNCHERS[eng] + " " + shell_args(argv), "fi"]
    return "\n".join(lines) + "\n"
