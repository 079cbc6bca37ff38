"""RunConfig → a ready Generator (model, tokenizer, EOS ids) on the chosen device and dtype."""

from __future__ import annotations

import torch

from pathlib import Path

import math

from moetune.config import OffloadConfig, ParallelConfig, QuantConfig, RunConfig
from moetune.engine.generate import Generator
from moetune.engine.tokenizer import eos_ids, load_tokenizer
from moetune.errors import MoetuneError
from moetune.model.loader import load_model, read_spec
from moetune.model.registry import resolve_model
from moetune.moe.dispatch import Dispatcher
from moetune.moe.placement import Placement, PlacementError, check_ep, make_placement, read_placement
from moetune.quant.loads import read_expert_loads
from moetune.quant.table import PrecisionTable, hot_fraction, read_table, uniform
from moetune.spec import ModelSpec

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


def build_generator(cfg: RunConfig, rank: int = 0, dispatcher: Dispatcher | None = None,
                    device: torch.device | None = None) -> Generator:
    """One rank's generator: with parallel.ep_size R > 1 (or replicas) the store holds this rank's
    slots of the placement and `dispatcher` moves token copies between ranks (engine/distributed.py)."""
    model = build_model(cfg, rank, dispatcher, device)
    model_dir = resolve_model(cfg.model.path)
    tokenizer = load_tokenizer(model_dir)
    return Generator(model, tokenizer, eos_ids(tokenizer, model.spec.eos_token_ids), cfg.engine)


def build_model(cfg: RunConfig, rank: int = 0, dispatcher: Dispatcher | None = None,
                device: torch.device | None = None):
    """The model as the recipe deploys it: placement, expert precision (quant), offloading, capacity."""
    model_dir = resolve_model(cfg.model.path)
    device = device or resolve_device(cfg.model.device)
    spec = read_spec(model_dir)
    placement = resolve_placement(cfg.parallel, spec)
    if placement is not None and placement.ep_size > 1 and dispatcher is None:
        raise MoetuneError(f"parallel.ep_size={placement.ep_size} runs on {placement.ep_size} ranks: start it through "
                           "moetune.engine.distributed.run_ranks (generate, bench and profile do), not build_generator")
    model = load_model(model_dir, resolve_dtype(cfg.model.dtype, device), device, cfg.model.kernel_backend,
                       placement, rank, dispatcher, precision_table(cfg.quant, spec),
                       offload_factory(cfg.offload, spec, device))
    if cfg.parallel.capacity_policy != "none":
        set_capacity(model, cfg.parallel.capacity_factor, cfg.parallel.capacity_policy)
    return model


def precision_table(quant: QuantConfig | None, spec: ModelSpec) -> PrecisionTable | None:
    """The recipe's quant section → a format per MoE layer × expert (None: keep the load dtype)."""
    if quant is None:
        return None
    layers, E = list(spec.moe_layers), spec.moe.num_experts
    if quant.experts is not None:
        return uniform(quant.experts, layers, E)
    if quant.table is not None:
        return read_table(Path(quant.table), layers, E)
    return hot_fraction(read_expert_loads(quant.loads, layers, E), layers, quant.hot_fraction, quant.high, quant.low)


def offload_factory(offload: OffloadConfig | None, spec: ModelSpec, device: torch.device):
    """The recipe's offload section → a store factory for `load_model` (None: every expert resident)."""
    if offload is None:
        return None
    from moetune.experts.offload import OffloadSettings, OffloadingExpertStore

    E = spec.moe.num_experts
    capacity = offload.resident_experts or math.ceil(offload.resident_fraction * E - 1e-9)
    warm = None
    if offload.warm_start is not None:
        warm = read_expert_loads(offload.warm_start, list(spec.moe_layers), E)
    settings = OffloadSettings(capacity, offload.policy, offload.tier, offload.dir, offload.prefetch_depth)
    return lambda layers, _spec: OffloadingExpertStore(layers, spec.moe.router.top_k, settings, device, warm)


def set_capacity(model, factor: float | None, policy: str) -> None:
    """Per-expert capacity on every MoE layer (None / "none": dropless)."""
    from moetune.moe.layer import MoELayer

    for layer in model.layers:
        if isinstance(layer.mlp, MoELayer):
            layer.mlp.capacity = None if factor is None or policy == "none" else (factor, policy)


def resolve_placement(par: ParallelConfig, spec: ModelSpec) -> Placement | None:
    """parallel.placement (a policy or a file) for this model; None when every expert is local once."""
    E, R = spec.moe.num_experts, par.ep_size
    if Path(par.placement).suffix == ".json" or Path(par.placement).exists():
        if par.redundant_experts:
            raise PlacementError("parallel.redundant_experts applies to a policy placement; a placement file "
                                 "fixes its own replicas (remove one of the two)")
        placement = read_placement(par.placement)
        placement.check_for(E, spec.moe_layers, R, spec.model_type, f"placement file '{par.placement}'")
        return placement
    check_ep(E, R, par.redundant_experts, par.ranks_per_node)
    if par.placement not in ("contiguous", "round_robin"):
        raise PlacementError(f"parallel.placement '{par.placement}' is neither contiguous, round_robin nor a "
                             "placement JSON file (eplb placements come from moetune placement --out FILE)")
    if R == 1 and not par.redundant_experts:
        return None
    return make_placement(par.placement, E, R, spec.moe_layers, par.redundant_experts, model_type=spec.model_type)
