"""The llama.cpp side of `bench_vs_llamacpp.py`: runs in the llama-cpp-python venv (no torch, no
moetune), one JSON request a line on stdin, one JSON answer a line on stdout.

  {"op": "info"}                                   → {"version", "system_info"} (llama.cpp's CPU flags)
  {"op": "quantize", "src", "dst", "ftype", "threads"}
                                                   → {} (llama_model_quantize; ftype "q8_0" | "q4_0";
                                                     pure: every 2-D weight in that type, as moetune's
                                                     --policy F --dense F packs every projection)
  {"op": "load", "name", "path", "threads"}        → {"n_vocab"} (model + context kept under name)
  {"op": "prefill", "name", "tokens": [...]}       → {"seconds"}: one llama_decode of the prompt into
                                                     an empty cache, logits of the last row only
  {"op": "decode", "name", "batch", "context", "steps", "seed"}
                                                   → {"seconds"}: `batch` sequences of `context` random
                                                     tokens prefilled (not timed), then `steps` steps
                                                     of one token per sequence, each picked greedily
                                                     from its logits (timed)

The same workloads as moetune's bench (`bench/throughput.py`: prefill 512 tokens with the LM head on
the last row; decode after a prefill of 128 tokens a sequence, 32 steps).
"""

from __future__ import annotations

import ctypes
import json
import random
import sys
import time

import llama_cpp as L
import numpy as np

MODELS: dict[str, tuple] = {}  # name → (model, ctx, batch, n_vocab)
BATCH_TOKENS, MAX_SEQS, N_CTX = 4096, 16, 4096


def _quantize(src: str, dst: str, ftype: str, threads: int) -> dict:
    params = L.llama_model_quantize_default_params()
    params.ftype = {"q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": L.LLAMA_FTYPE_MOSTLY_Q4_0}[ftype]
    params.nthread = threads
    params.pure = True
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    return {}


def _load(name: str, path: str, threads: int) -> dict:
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise RuntimeError(f"cannot load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = N_CTX, BATCH_TOKENS, 512, MAX_SEQS
    cp.n_threads = cp.n_threads_batch = threads
    if hasattr(cp, "kv_unified"):
        cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError(f"cannot make a context for {path}")
    batch = L.llama_batch_init(BATCH_TOKENS, 0, MAX_SEQS)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    MODELS[name] = (model, ctx, batch, n_vocab)
    return {"n_vocab": n_vocab}


def _fill(batch, rows: list[tuple[int, int, int, bool]]) -> None:
    """rows: (token, position, sequence, wants logits)."""
    batch.n_tokens = len(rows)
    for i, (tok, pos, seq, logits) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits


def _clear(ctx) -> None:
    L.llama_memory_clear(L.llama_get_memory(ctx), True)


def _decode(ctx, batch) -> None:
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def _prefill(name: str, tokens: list[int]) -> dict:
    _, ctx, batch, _ = MODELS[name]
    _clear(ctx)
    _fill(batch, [(t, p, 0, p == len(tokens) - 1) for p, t in enumerate(tokens)])
    start = time.perf_counter()
    _decode(ctx, batch)
    L.llama_get_logits_ith(ctx, len(tokens) - 1)
    return {"seconds": time.perf_counter() - start}


def _greedy(ctx, n_vocab: int, rows: int) -> list[int]:
    out = []
    for i in range(rows):
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
        out.append(int(logits.argmax()))
    return out


def _decode_steps(name: str, batch_size: int, context: int, steps: int, seed: int) -> dict:
    _, ctx, batch, n_vocab = MODELS[name]
    rng = random.Random(seed)
    _clear(ctx)
    for s in range(batch_size):  # the prompts, one sequence a call (not timed)
        _fill(batch, [(rng.randrange(3, n_vocab), p, s, p == context - 1) for p in range(context)])
        _decode(ctx, batch)
    last = [rng.randrange(3, n_vocab) for _ in range(batch_size)]
    start = time.perf_counter()
    for step in range(steps):
        _fill(batch, [(last[s], context + step, s, True) for s in range(batch_size)])
        _decode(ctx, batch)
        last = _greedy(ctx, n_vocab, batch_size)
    return {"seconds": time.perf_counter() - start}


def handle(req: dict) -> dict:
    op = req["op"]
    if op == "info":
        return {"version": L.__version__, "system_info": L.llama_print_system_info().decode()}
    if op == "quantize":
        return _quantize(req["src"], req["dst"], req["ftype"], req["threads"])
    if op == "load":
        return _load(req["name"], req["path"], req["threads"])
    if op == "prefill":
        return _prefill(req["name"], req["tokens"])
    if op == "decode":
        return _decode_steps(req["name"], req["batch"], req["context"], req["steps"], req["seed"])
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    L.llama_backend_init()
    for line in sys.stdin:
        try:
            answer = handle(json.loads(line))
        except Exception as exc:  # reported to the driver, which stops with it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
