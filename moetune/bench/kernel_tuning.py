"""Tune the expert GEMM launch configs on real routing (`moetune tune-kernels`).

Runs the model on prompt tokens, records each MoE layer's topk_ids through the probe protocol,
sweeps the w13 and w2 GEMM configs per batch size on those routings, and writes vLLM-named JSON.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from moetune.errors import MoetuneError

if TYPE_CHECKING:
    import torch

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_DTYPES = ("bfloat16", "float16", "float32")


class RoutingRecorder:
    """A Probe that keeps every MoE layer's topk_ids and times nothing."""

    def __init__(self):
        self.topk_ids: dict[int, list[torch.Tensor]] = {}

    def phase(self, layer: int, name: str):
        return nullcontext()

    def routed(self, layer: int, route, permute, block_m: int) -> None:
        self.topk_ids.setdefault(layer, []).append(route.topk_ids.detach())

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        return None


def tune_kernels(model: str, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, out_dir: str | None = None,
                         dtype: str = "bfloat16", search: str = "small", tokens: int = 4096,
                         max_layers: int = 4, device: str = "cuda") -> list[Path]:
    """Tune and write `E=..,N=..,device_name=..json` (w13) and its `_down` twin (w2); returns the paths."""
    import torch

    if not torch.cuda.is_available():
        raise MoetuneError("tune-kernels needs a CUDA device; none found")
    if dtype not in _DTYPES:
        raise MoetuneError(f"unknown --dtype '{dtype}' (choose from: {', '.join(_DTYPES)})")
    if search not in ("small", "full"):
        raise MoetuneError(f"unknown --search '{search}' (choose from: small, full)")
    from moetune.kernels.configs import CONFIG_DIR, config_file_name, device_name, save_table
    from moetune.kernels.tuning import tune
    from moetune.model.loader import load_model

    from moetune.model.registry import resolve_model

    model_dir = resolve_model(model)
    net = load_model(model_dir, dtype=getattr(torch, dtype), device=device, kernel_backend="triton")
    routing = record_routing(net, _prompt_tokens(model_dir, tokens, net.spec.vocab_size))
    layers = sorted(routing)[:max_layers]
    E, N = net.spec.moe.num_experts, net.spec.moe.intermediate_size
    up, down = tune(lambda m: _problems(net, routing, layers, m), batch_sizes, search,
                    on_batch=lambda m, u, d: print(f"M={m}: w13 {u.to_json()}  w2 {d.to_json()}", file=sys.stderr))
    target = Path(out_dir) if out_dir else CONFIG_DIR
    target.mkdir(parents=True, exist_ok=True)
    name = device_name(torch.device(device))
    paths = [target / config_file_name(E, N, name, gemm="up"), target / config_file_name(E, N, name, gemm="down")]
    save_table(paths[0], up)
    save_table(paths[1], down)
    return paths


def record_routing(net, token_ids: torch.Tensor, chunk: int = 1024) -> dict[int, torch.Tensor]:
    """Prefill the tokens in chunks through the ModelRunner with a RoutingRecorder attached → layer →
    topk_ids [tokens, K]."""
    import torch

    from moetune.engine.model_runner import ModelRunner

    chunk = min(chunk, net.spec.max_position)
    runner = ModelRunner(net, num_blocks=-(-chunk // 16), block_size=16)
    recorder = RoutingRecorder()
    net.attach_probe(recorder)
    try:
        for start in range(0, token_ids.numel(), chunk):
            runner.forward_prompts([token_ids[start:start + chunk].tolist()])
    finally:
        net.attach_probe(None)
    return {layer: torch.cat(ids) for layer, ids in recorder.topk_ids.items()}


def _prompt_tokens(model_dir: Path, n: int, vocab: int) -> torch.Tensor:
    """n token ids from the bundled held-out prompts (the model's tokenizer), else uniform random ids."""
    import torch

    from moetune.model.registry import bundled_asset

    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        text = "\n".join(json.loads(line)["prompt"] for line in bundled_asset("prompts/stdlib-heldout.jsonl").read_text().splitlines() if line.strip())
        ids = torch.tensor(tok(text)["input_ids"], dtype=torch.long)
        ids = ids[ids < vocab]
        if ids.numel():
            return ids.repeat(n // ids.numel() + 1)[:n]
    except Exception:  # noqa: BLE001 — no tokenizer in the checkpoint: routing from random ids still works
        pass
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0))


def _problems(net, routing: dict[int, torch.Tensor], layers: list[int], m: int):
    import torch

    from moetune.kernels.tuning import ExpertProblem

    out = []
    for layer in layers:
        ids = routing[layer]
        ids = ids.repeat(m // ids.shape[0] + 1, 1)[:m]  # [M, K] real routed rows
        w = net.experts.acquire(layer, ids)
        w13, w2 = w.w13.data, w.w2.data
        x = torch.randn(m, w13.shape[2], dtype=w13.dtype, device=w13.device)  # [M, D]
        out.append(ExpertProblem(x, w13, w2, ids.to(w13.device)))
    return out
