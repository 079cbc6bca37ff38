"""One resolved target, built once at the edge (a command, the server, the measure evaluator) and
passed down to build_model / load_model / run_profile instead of a RunConfig each resolves again:
the checked checkpoint (directory, spec, tensor index), the placement of `parallel`, the device and
the dtype. A later change of recipe keeps the checkpoint (`with_config`). Mistakes the checkpoints show
(a split the model cannot take, a speculator it cannot run) are refused here, before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.config import ParallelConfig, RunConfig
from moetune.engine.limits import max_len_of
from moetune.engine.speculative.check import check_speculative
from moetune.errors import MoetuneError
from moetune.model.checkpoint import Checkpoint, open_checkpoint
from moetune.model.tp_check import check_tp
from moetune.moe.placement import Placement, PlacementError, check_ep, make_placement, read_placement
from moetune.spec import ModelSpec

if TYPE_CHECKING:
    import torch

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # a recipe's dtype → torch's name


@dataclass(frozen=True)
class Target:
    config: RunConfig
    checkpoint: Checkpoint
    placement: Placement | None  # None: every expert local once (R = 1, no replicas)
    device: torch.device
    dtype: torch.dtype

    @property
    def model_dir(self) -> Path:
        return self.checkpoint.model_dir

    @property
    def spec(self) -> ModelSpec:
        return self.checkpoint.spec

    @property
    def max_len(self) -> int:
        """Tokens one sequence may hold: the engine's own rule (engine/limits.py) for this recipe and model."""
        return max_len_of(self.config.engine, self.spec.max_position)

    def with_config(self, cfg: RunConfig) -> "Target":
        """The same checkpoint under another recipe: the placement, device and dtype follow `cfg`
        (a recipe for another model is resolved from scratch)."""
        if cfg.model.path != self.config.model.path:
            return resolve_target(cfg)
        if cfg.engine.speculative != self.config.engine.speculative:
            check_speculative(cfg.engine.speculative, self.checkpoint)
        placement = self.placement if cfg.parallel == self.config.parallel else resolve_placement(cfg.parallel,
                                                                                                    self.spec)
        device = self.device if cfg.model.device == self.config.model.device else resolve_device(cfg.model.device)
        return Target(cfg, self.checkpoint, placement, device, resolve_dtype(cfg.model.dtype, device))


def resolve_target(cfg: RunConfig, checkpoint: Checkpoint | None = None) -> Target:
    """Checkpoint mistakes first (no torch work), then the placement, then the device."""
    if cfg.engine_refusal():  # a serving engine's mesh / disaggregation (config.DeployConfig)
        raise MoetuneError(cfg.engine_refusal())
    checkpoint = checkpoint or open_checkpoint(cfg.model.path)
    placement = resolve_placement(cfg.parallel, checkpoint.spec)
    check_tp(checkpoint.spec, cfg.parallel.tp_size, cfg.parallel.expert_tp)  # a split this model cannot take
    check_speculative(cfg.engine.speculative, checkpoint)  # mtp:K without an MTP layer, a draft not this model's
    device = resolve_device(cfg.model.device)
    return Target(cfg, checkpoint, placement, device, resolve_dtype(cfg.model.dtype, device))


def resolve_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MoetuneError(f"device '{name}' requested but no CUDA device is available; use --device cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        name = "bf16" if device.type == "cuda" else "fp32"
    return torch_dtype(name)


def torch_dtype(name: str) -> torch.dtype:
    """A recipe's dtype name (fp32, bf16, fp16) → the torch dtype."""
    import torch

    return getattr(torch, DTYPES[name])


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
