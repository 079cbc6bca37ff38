"""Lazy safetensors reader: one file or shards listed in `model.safetensors.index.json`.

Tensors are memory-mapped (`safe_open`) and materialised one at a time on the target device and
dtype, so peak host memory stays near the size of the weights themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from moetune.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"


class WeightSource:
    """Name → tensor over the checkpoint's safetensors files."""

    def __init__(self, model_dir: Path, device: torch.device | str, dtype: torch.dtype):
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.dtype = dtype
        self._file_of = _index(self.model_dir)  # tensor name -> file name
        self._handles: dict[str, object] = {}
        self.bytes_read = 0  # bytes of tensor data read from the files (as stored)

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def has(self, name: str) -> bool:
        return name in self._file_of

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor `name` on the target device, cast to `dtype` (default: the load dtype)."""
        if name not in self._file_of:
            raise CheckpointError(f"tensor '{name}' is missing from the checkpoint in {self.model_dir}")
        tensor = self._handle(self._file_of[name]).get_tensor(name)
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor.to(device=self.device, dtype=dtype or self.dtype)

    def part(self, name: str, index: tuple[slice, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        """tensor[index] on the target device: only that slice is read from the mmap'd file
        (a tensor-parallel rank's share, model/tp_shards.py)."""
        if name not in self._file_of:
            raise CheckpointError(f"tensor '{name}' is missing from the checkpoint in {self.model_dir}")
        tensor = self._handle(self._file_of[name]).get_slice(name)[index]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor.to(device=self.device, dtype=dtype or self.dtype)

    def raw(self, name: str) -> torch.Tensor:
        """The tensor as stored (its own dtype, on the CPU): packed weights, copies between checkpoints."""
        if name not in self._file_of:
            raise CheckpointError(f"tensor '{name}' is missing from the checkpoint in {self.model_dir}")
        tensor = self._handle(self._file_of[name]).get_tensor(name)
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def get_optional(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        return self.get(name, dtype) if self.has(name) else None

    def first(self, *names: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The first of several alternative names that exists (naming differs between exporters)."""
        for name in names:
            if self.has(name):
                return self.get(name, dtype)
        raise CheckpointError(f"tensor '{names[0]}' is missing from the checkpoint in {self.model_dir}")

    def _handle(self, file_name: str):
        if file_name not in self._handles:
            self._handles[file_name] = safe_open(str(self.model_dir / file_name), framework="pt", device="cpu")
        return self._handles[file_name]


def _index(model_dir: Path) -> dict[str, str]:
    index_path = model_dir / INDEX_FILE
    if index_path.exists():
        weight_map = json.loads(index_path.read_text())["weight_map"]
        missing = sorted({f for f in weight_map.values() if not (model_dir / f).exists()})
        if missing:
            raise CheckpointError(f"shard '{missing[0]}' listed in {INDEX_FILE} is missing from {model_dir}")
        return dict(weight_map)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in {model_dir}; save the model with save_pretrained")
    file_of: dict[str, str] = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            file_of.update({name: path.name for name in handle.keys()})
    return file_of
