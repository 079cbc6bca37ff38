"""Models shipped inside the package, addressable by a short name wherever --model is accepted."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from moetune.errors import CheckpointError

DEFAULT_MODEL = "stdlib-moe"
_BUNDLED = {
    "stdlib-moe": ("assets/models/stdlib-moe", "qwen3_moe-style MoE trained on the Python standard library"),
}


@dataclass(frozen=True)
class BundledModel:
    name: str
    path: Path
    description: str


def bundled_models() -> list[BundledModel]:
    root = Path(str(resources.files("moetune")))
    return [BundledModel(name, root / rel, desc) for name, (rel, desc) in _BUNDLED.items()]


def resolve_model(name_or_path: str | Path | None) -> Path:
    """A bundled short name, a directory, or None for the default model → checkpoint directory."""
    value = str(name_or_path) if name_or_path is not None else DEFAULT_MODEL
    for model in bundled_models():
        if value == model.name:
            if not (model.path / "config.json").exists():
                raise CheckpointError(f"bundled model '{value}' is missing from this install ({model.path})")
            return model.path
    path = Path(value).expanduser()
    if not path.is_dir():
        names = ", ".join(m.name for m in bundled_models())
        raise CheckpointError(f"model '{value}' is neither a directory nor a bundled model ({names})")
    return path


def bundled_asset(relative: str) -> Path:
    return Path(str(resources.files("moetune"))) / "assets" / relative
