"""Mixed-precision checkpoints: write one (`moetune quantize`); `expert_tensors.py` reads its packed experts back.

The layout is `quant_checkpoint.py`. Writing reads the source checkpoint through the same loader
functions a forward uses (so fused and per-expert sources both work), packs each routed expert in
its table format (`moetune.quant.formats`), with a dense format every dense projection weight
(`model/dense_quant.py`), copies every other tensor unchanged, and renames a
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
from moetune.model.dense_quant import pack_weight
from moetune.model.quant_checkpoint import QUANT_KEY, expert_names, is_dense_linear, packed_names, quant_block
from moetune.model.weights import WeightSource
from moetune.quant.formats import packed_bytes, parse_format, pack
from moetune.quant.table import PrecisionTable
from moetune.spec import ModelSpec


def write_quantized(model_dir: Path, spec: ModelSpec, table: PrecisionTable | None, out: Path,
                    dense: str | None = None, on_layer=None) -> dict[str, int]:
    """Write the mixed checkpoint to `out` (experts packed by `table` unless None; dense projections
    in `dense` unless None); returns {"expert_bytes_before", "expert_bytes_after", "dense_bytes_before",
    "dense_bytes_after"}. on_layer: progress, on_layer(done, total) after each MoE layer's experts are packed."""
    from safetensors.torch import save_file

    model_dir, out = Path(model_dir), Path(out)
    source = WeightSource(model_dir, "cpu", torch.float32)
    names = TensorNames(spec.model_type)
    tensors, sizes = {}, dict.fromkeys(("expert_bytes_before", "expert_bytes_after", "dense_bytes_before",
                                        "dense_bytes_after"), 0)
    expert_sources = _expert_source_names(source, names, spec) if table is not None else set()
    if table is not None:
        _pack_experts(source, names, spec, table, tensors, sizes, on_layer)
    for name in source.names():
        if name in expert_sources:
            continue
        if dense is not None and is_dense_linear(name):
            _pack_dense(name, source.raw(name), dense, tensors, sizes)
        else:
            tensors[name] = source.raw(name).contiguous()
    if dense is not None and "lm_head.weight" not in source.names():  # tied: the head gets its own packed copy
        _pack_dense("lm_head.weight", source.raw("model.embed_tokens.weight"), dense, tensors, sizes)
    _write_dir(model_dir, out, tensors, quant_block(table, dense), save_file)
    return sizes


def _pack_experts(source: WeightSource, names: TensorNames, spec: ModelSpec, table: PrecisionTable,
                  tensors: dict, sizes: dict, on_layer=None) -> None:
    layers = list(spec.moe_layers)
    for done, i in enumerate(layers, 1):
        dense = read_experts(source, names, spec, i)
        w13, w2 = dense.w13.data, dense.w2.data  # [E, 2I, D], [E, D, I]
        sizes["expert_bytes_before"] += _source_expert_bytes(source, names, spec, i)
        for e, name in enumerate(table.layer(i)):
            fmt, n = parse_format(name), expert_names(names, i, e)
            for w, full in (("w13", w13[e]), ("w2", w2[e])):
                packed = pack(full, fmt)
                tensors[n[w]] = packed.data.contiguous()
                if packed.scale is not None:
                    tensors[n[w + "_scale"]] = packed.scale.float().contiguous()
                sizes["expert_bytes_after"] += packed_bytes(packed)
        if on_layer is not None:
            on_layer(done, len(layers))


def _pack_dense(name: str, w: torch.Tensor, fmt: str, tensors: dict, sizes: dict) -> None:
    """`P.weight` [N, K] → `P.qweight`, `P.scales` in `fmt` (`model/dense_quant.py`)."""
    packed = pack_weight(w, fmt, name)
    q, s = packed_names(name)
    tensors[q], tensors[s] = packed.data.contiguous(), packed.scale.float().contiguous()
    sizes["dense_bytes_before"] += w.nbytes
    sizes["dense_bytes_after"] += packed_bytes(packed)


def _expert_source_names(source: WeightSource, names: TensorNames, spec: ModelSpec,
                         layers: list[int] | None = None) -> set[str]:
    out = set()
    for i in spec.moe_layers if layers is None else layers:
        out.update(names.fused_experts(i))
        out.update(names.expert(i, e, w) for e in range(spec.moe.num_experts) for w in ("gate", "up", "down"))
    return out & set(source.names())


def _source_expert_bytes(source: WeightSource, names: TensorNames, spec: ModelSpec, i: int) -> int:
    return sum(source.raw(n).nbytes for n in _expert_source_names(source, names, spec, [i]))


def _write_dir(model_dir: Path, out: Path, tensors: dict, block: dict, save_file) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for f in model_dir.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("config.json",
                                                                                     "model.safetensors.index.json"):
                shutil.copy2(f, tmp / f.name)
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        cfg[QUANT_KEY] = block
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
