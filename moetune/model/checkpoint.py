"""A checkpoint resolved and checked once, from config.json and the safetensors headers alone (no
torch): its directory, its ModelSpec and the validated tensor index. Everything that loads or sizes a
model takes it from here (engine/target.py carries it from the edge to the loader)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moetune.model.registry import resolve_model
from moetune.model.validate import TensorInfo, read_spec, validate_checkpoint
from moetune.spec import ModelSpec


@dataclass(frozen=True)
class Checkpoint:
    model_dir: Path
    spec: ModelSpec
    tensors: dict[str, TensorInfo]  # every tensor the loader can see, checked against the spec

    @property
    def name(self) -> str:
        return self.model_dir.name


def open_checkpoint(name_or_path: str | Path | None) -> Checkpoint:
    """A bundled name, a directory or None (the default model) → the checked checkpoint; every
    checkpoint mistake is a `CheckpointError` here, before anything is loaded."""
    return checkpoint_at(resolve_model(name_or_path))


def checkpoint_at(model_dir: Path | str) -> Checkpoint:
    """A checkpoint directory (no bundled names) → the checked checkpoint."""
    model_dir = Path(model_dir)
    spec = read_spec(model_dir)
    return Checkpoint(model_dir, spec, validate_checkpoint(model_dir, spec))
