"""A checkpoint resolved and checked once, from config.json and the safetensors headers alone (no
torch): its directory, its ModelSpec and the validated tensor index. Everything that loads or sizes a
model takes it from here (engine/target.py carries it from the edge to the loader)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import CheckpointError
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


def mtp_config(model_dir: Path | str) -> dict:
    """config.json of a checkpoint with a multi-token-prediction layer (`num_nextn_predict_layers` ≥ 1);
    without one, the one-line refusal `mtp:K` gets (engine/speculative/check.py before any model loads,
    model/loader.py's load_mtp for a model built directly)."""
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if not cfg.get("num_nextn_predict_layers"):
        raise CheckpointError(f"{path} has no num_nextn_predict_layers: this checkpoint has no MTP layer; "
                              "use ngram:K or draft:DIR:K")
    return cfg
