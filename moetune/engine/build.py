"""RunConfig → a ready Generator (model, tokenizer, EOS ids) on the chosen device and dtype."""

from __future__ import annotations

import torch

from moetune.config import RunConfig
from moetune.engine.generate import Generator
from moetune.engine.tokenizer import eos_ids, load_tokenizer
from moetune.errors import MoetuneError
from moetune.model.loader import load_model
from moetune.model.registry import resolve_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MoetuneError(f"device '{name}' requested but no CUDA device is available; use --device cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def build_generator(cfg: RunConfig) -> Generator:
    model_dir = resolve_model(cfg.model.path)
    device = resolve_device(cfg.model.device)
    model = load_model(model_dir, resolve_dtype(cfg.model.dtype, device), device, cfg.model.kernel_backend)
    _check_parallel(cfg, model.spec.moe.num_experts)
    tokenizer = load_tokenizer(model_dir)
    return Generator(model, tokenizer, eos_ids(tokenizer, model.spec.eos_token_ids), cfg.engine)


def _check_parallel(cfg: RunConfig, num_experts: int) -> None:
    if num_experts % cfg.parallel.ep_size:
        raise MoetuneError(
            f"parallel.ep_size={cfg.parallel.ep_size} does not divide the model's {num_experts} experts; "
            "choose a divisor"
        )
