"""RunConfig: one typed description of a deployment, loaded from a recipe YAML or CLI flags.

`load_recipe()` turns YAML into a validated RunConfig; unknown keys, wrong types and impossible
values are `RecipeError`s naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from moetune.errors import RecipeError

Precision = Literal["bf16", "fp16", "fp32", "fp8", "int8", "int4"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    path: str | None = None  # checkpoint dir or bundled name; None = the bundled default
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: fp32 on CPU, bf16 on CUDA
    device: str = "auto"  # auto: cuda if available, else cpu
    kernel_backend: Literal["auto", "torch", "triton"] = "auto"


class ParallelConfig(_Section):
    ep_size: int = Field(1, ge=1)  # R: expert-parallel ranks
    ranks_per_node: int = Field(1, ge=1)


class QuantConfig(_Section):
    experts: Precision = "bf16"  # default precision of routed experts
    per_expert: dict[str, Precision] = Field(default_factory=dict)  # "layer.expert" → precision


class OffloadConfig(_Section):
    enabled: bool = False
    resident_experts: int = Field(0, ge=0)  # per layer, on device
    prefetch_depth: int = Field(0, ge=0)  # layers ahead


class EngineConfig(_Section):
    max_batch_size: int = Field(16, ge=1)
    max_model_len: int | None = Field(None, ge=1)


class ServeConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)


class RunConfig(_Section):
    name: str = "default"
    model: ModelConfig = ModelConfig()
    parallel: ParallelConfig = ParallelConfig()
    quant: QuantConfig = QuantConfig()
    offload: OffloadConfig = OffloadConfig()
    engine: EngineConfig = EngineConfig()
    serve: ServeConfig = ServeConfig()

    @model_validator(mode="after")
    def _ranks_fit(self) -> "RunConfig":
        p = self.parallel
        if p.ep_size > 1 and p.ep_size % p.ranks_per_node and p.ranks_per_node % p.ep_size:
            raise ValueError(f"parallel.ep_size={p.ep_size} and parallel.ranks_per_node={p.ranks_per_node} do not tile")
        return self


def load_recipe(path: str | Path) -> RunConfig:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe '{path}' is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe '{path}' must be a mapping of sections (model, parallel, ...)")
    return parse_config(data, source=str(path))


def parse_config(data: dict, source: str = "recipe") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"{source}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(part) for part in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    return f"key '{key}': {err['msg']}"
