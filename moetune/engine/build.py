"""A resolved Target (engine/target.py) → a ready Generator (model, tokenizer, EOS ids) on its device and dtype."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch

from moetune.config import OffloadConfig, QuantConfig, RunConfig
from moetune.engine.generate import Generator
from moetune.engine.target import Target, resolve_dtype, resolve_target
from moetune.engine.target import resolve_device, resolve_placement  # noqa: F401 (their old home)
from moetune.engine.tokenizer import eos_ids, load_tokenizer
from moetune.errors import MoetuneError
from moetune.model.loader import load_model
from moetune.model.tp import TPComm
from moetune.moe.dispatch import Dispatcher
from moetune.quant.loads import read_expert_loads
from moetune.quant.table import PrecisionTable, hot_fraction, read_table, uniform
from moetune.spec import ModelSpec

def build_generator(target: Target | RunConfig, rank: int = 0, dispatcher: Dispatcher | None = None,
                    device: torch.device | None = None, tp: TPComm | None = None, tokenizer=None) -> Generator:
    """One rank's generator: with parallel.ep_size R > 1 (or replicas) the store holds this rank's
    slots of the placement and `dispatcher` moves token copies between ranks (engine/distributed.py);
    with `tp` it holds this rank's slices of the weights (model/tp.py).
    `target`: resolved once by the caller (a RunConfig is resolved here, for library callers);
    `tokenizer`: the checkpoint's, when the caller loaded it already (None: loaded here)."""
    target = as_target(target, device)
    model = build_model(target, rank, dispatcher, tp=tp)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(target.model_dir)
    return Generator(model, tokenizer, eos_ids(tokenizer, model.spec.eos_token_ids), target.config.engine)


def build_model(target: Target | RunConfig, rank: int = 0, dispatcher: Dispatcher | None = None,
                device: torch.device | None = None, tp: TPComm | None = None):
    """The model as the recipe deploys it: placement, expert precision (quant), offloading, capacity."""
    target = as_target(target, device)
    cfg, spec, placement, device = target.config, target.spec, target.placement, target.device
    if placement is not None and placement.ep_size > 1 and dispatcher is None:
        raise MoetuneError(f"parallel.ep_size={placement.ep_size} runs on {placement.ep_size} ranks: start it through "
                           "moetune.engine.distributed.run_ranks (generate, bench and profile do), not build_generator")
    if cfg.parallel.group_size > 1 and tp is None:
        raise MoetuneError(f"parallel.tp_size={cfg.parallel.tp_size} / expert_tp_size={cfg.parallel.expert_tp} run on "
                           f"{cfg.parallel.world} ranks: start it through moetune.engine.distributed.run_ranks")
    model = load_model(target.checkpoint, target.dtype, device, cfg.model.kernel_backend,
                       placement, rank, dispatcher, precision_table(cfg.quant, spec),
                       offload_factory(cfg.offload, spec, device), tp,
                       dense=cfg.quant.dense if cfg.quant is not None else None)
    if cfg.parallel.capacity_policy != "none":
        set_capacity(model, cfg.parallel.capacity_factor, cfg.parallel.capacity_policy)
    return model


def as_target(target: Target | RunConfig, device: torch.device | None = None) -> Target:
    """A Target as given (a RunConfig resolved once); `device` (a rank's own) replaces the recipe's."""
    if isinstance(target, RunConfig):
        target = resolve_target(target)
    if device is None or device == target.device:
        return target
    return replace(target, device=device, dtype=resolve_dtype(target.config.model.dtype, device))


def precision_table(quant: QuantConfig | None, spec: ModelSpec) -> PrecisionTable | None:
    """The recipe's quant section → a format per MoE layer × expert (None: keep the load dtype)."""
    if quant is None or (quant.experts is None and quant.table is None and quant.hot_fraction is None):
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
    warm = None if offload.warm_start is None else warm_loads(offload.warm_start, list(spec.moe_layers), E)
    settings = OffloadSettings(capacity, offload.policy, offload.tier, offload.dir, offload.prefetch_depth,
                               offload.hints, offload.demote_after, offload.disk_after)
    return lambda layers, _spec: OffloadingExpertStore(layers, spec.moe.router.top_k, settings, device, warm)


def warm_loads(source: str, layers: list[int], num_experts: int):
    """offload.warm_start → [Lm, E] loads: a run directory (profile, or serve's recording) or a JSON
    loads file (`moetune placement --loads`' format: one list of E numbers per MoE layer)."""
    if not str(source).endswith(".json"):
        return read_expert_loads(source, layers, num_experts)
    from moetune.errors import RecipeError
    from moetune.moe.placement import read_loads

    loads = read_loads(source)
    if loads.shape != (len(layers), num_experts):
        raise RecipeError(f"offload.warm_start '{source}' holds {loads.shape[0]} layers × {loads.shape[1]} experts; "
                          f"this model has {len(layers)} MoE layers × {num_experts} experts")
    return loads


def capacity_counts(model, reset: bool = False) -> dict[str, int]:
    """Copies the MoE layers' capacity dropped, rerouted and buffered (second pass) since the last
    reset, summed over layers; `reset` zeroes them after reading."""
    from moetune.moe.layer import MoELayer

    out = {"dropped": 0, "rerouted": 0, "buffered": 0}
    for layer in model.layers:
        if isinstance(layer.mlp, MoELayer):
            for k in out:
                out[k] += getattr(layer.mlp, k)
            if reset:
                layer.mlp.reset_counts()
    return out


def set_capacity(model, factor: float | None, policy: str) -> None:
    """Per-expert capacity on every MoE layer (None / "none": dropless)."""
    from moetune.moe.layer import MoELayer

    for layer in model.layers:
        if isinstance(layer.mlp, MoELayer):
            layer.mlp.capacity = None if factor is None or policy == "none" else (factor, policy)
