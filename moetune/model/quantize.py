"""Mixed-precision checkpoints: write one (`moetune quantize`); `expert_tensors.py` reads its packed experts back.

The layout is `quant_checkpoint.py`. Writing reads the source checkpoint through the same loader
functions a forward uses (so fused and per-expert sources both work), packs each routed expert in
its table format (`moetune.quant.formats`), copies every other tensor unchanged, and renames a
finished temporary directory into place (a failed run leaves nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from moetune.model.expert_tensors import read_experts
from moetune.model.naming import TensorNames
from moetune.model.quant_checkpoint import QUANT_KEY, expert_names, quant_block
from moetune.model.weights import WeightSource
from moetune.quant.formats import parse_format, pack
from moetune.quant.table import PrecisionTable
from moetune.spec import ModelSpec


def write_quantized(model_dir: Path, spec: ModelSpec, table: PrecisionTable, out: Path,
                    on_layer=None) -> dict[str, int]:
    """Write the mixed checkpoint to `out`; returns {"expert_bytes_before", "expert_bytes_after"}.
    on_layer: progress, on_layer(done, total) after each MoE layer is packed."""
    from safetensors.torch import save_file

    model_dir, out = Path(model_dir), Path(out)
    source = WeightSource(model_dir, "cpu", torch.float32)
    names = TensorNames(spec.model_type)
    tensors, before, after = {}, 0, 0
    layers = list(spec.moe_layers)
    for done, i in enumerate(layers, 1):
        dense = read_experts(source, names, spec, i)
        w13, w2 = dense.w13.data, dense.w2.data  # [E, 2I, D], [E, D, I]
        before += _source_expert_bytes(source, names, spec, i)
        for e, name in enumerate(table.layer(i)):
            fmt, n = parse_format(name), expert_names(names, i, e)
            for w, full in (("w13", w13[e]), ("w2", w2[e])):
                packed = pack(full, fmt)
                tensors[n[w]] = packed.data.contiguous()
                if packed.scale is not None:
                    tensors[n[w + "_scale"]] = packed.scale.float().contiguous()
                after += packed.data.nbytes + (packed.scale.nbytes if packed.scale is not None else 0)
        if on_layer is not None:
            on_layer(done, len(layers))
    expert_sources = _expert_source_names(source, names, spec)
    for name in source.names():
        if name not in expert_sources:
            tensors[name] = source.raw(name).contiguous()
    _write_dir(model_dir, out, tensors, table, save_file)
    return {"expert_bytes_before": before, "expert_bytes_after": after}


def _expert_source_names(source: WeightSource, names: TensorNames, spec: ModelSpec,
                         layers: list[int] | None = None) -> set[str]:
    out = set()
    for i in spec.moe_layers if layers is None else layers:
        out.update(names.fused_experts(i))
        out.update(names.expert(i, e, w) for e in range(spec.moe.num_experts) for w in ("gate", "up", "down"))
    return out & set(source.names())


def _source_expert_bytes(source: WeightSource, names: TensorNames, spec: ModelSpec, i: int) -> int:
    return sum(source.raw(n).nbytes for n in _expert_source_names(source, names, spec, [i]))


def _write_dir(model_dir: Path, out: Path, tensors: dict, table: PrecisionTable, save_file) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for f in model_dir.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("config.json",
                                                                                     "model.safetensors.index.json"):
                shutil.copy2(f, tmp / f.name)
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        cfg[QUANT_KEY] = quant_block(table)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
