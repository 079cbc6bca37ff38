"""The layout of a mixed-precision checkpoint written by `moetune quantize` (torch-free: validation
reads it from config.json and the safetensors headers alone).

config.json gains
  "quantization": {"quant_method": "moetune-experts", "version": 1,
                   "formats": {"<moe layer>": ["<format of expert 0>", ...]}}
and each routed expert e of MoE layer i is stored as
  {moe prefix}experts.{e}.w13.qweight  [2I, D] (int4: [2I, D/2] U8; int8: I8; fp8: F8_E4M3; plain: its float)
  {moe prefix}experts.{e}.w13.scales   [2I] F32 (int8, fp8) | [2I, D/G] F32 (int4-gG) | absent (plain)
  {moe prefix}experts.{e}.w2.qweight   [D, I] likewise,  ….w2.scales [D] | [D, I/G]
(w13 = gate rows, then up rows: each expert's two GEMMs are two contiguous tensors). Everything
else is copied from the source checkpoint unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from moetune.errors import CheckpointError
from moetune.model.naming import TensorNames
from moetune.quant.names import QuantError, parse_name
from moetune.quant.table import PrecisionTable
from moetune.spec import ModelSpec

QUANT_KEY = "quantization"
QUANT_METHOD = "moetune-experts"


def expert_names(names: TensorNames, i: int, e: int) -> dict[str, str]:
    p = f"{names.moe(i)}experts.{e}."
    return {"w13": p + "w13.qweight", "w13_scale": p + "w13.scales", "w2": p + "w2.qweight", "w2_scale": p + "w2.scales"}


def quant_block(table: PrecisionTable) -> dict:
    return {"quant_method": QUANT_METHOD, "version": 1, "formats": table.to_json()}


def read_quantization(model_dir: Path, spec: ModelSpec) -> PrecisionTable | None:
    """The checkpoint's precision table from config.json, or None for a plain checkpoint."""
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    block = cfg.get(QUANT_KEY)
    if block is None:
        return None
    if not isinstance(block, dict) or block.get("quant_method") != QUANT_METHOD or not isinstance(
            block.get("formats"), dict):
        raise CheckpointError(f"{path}: '{QUANT_KEY}' is not a moetune expert quantization block "
                              f"(quant_method '{QUANT_METHOD}' with 'formats'); only moetune quantize's output loads")
    try:
        table = PrecisionTable.from_json(block["formats"])
        table.check_for(list(spec.moe_layers), spec.moe.num_experts, f"{path} '{QUANT_KEY}'")
        for layer in spec.moe_layers:
            for name in set(table.layer(layer)):
                f = parse_name(name)
                f.check_dim(spec.hidden_size, "hidden_size")
                f.check_dim(spec.moe.intermediate_size, "moe intermediate size")
    except (QuantError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: bad '{QUANT_KEY}' block: {exc}") from None
    return table


def expected_quantized(spec: ModelSpec, names: TensorNames, i: int, formats: tuple[str, ...]
                       ) -> dict[str, tuple[tuple[int, ...], bool, tuple[str, ...]]]:
    """name → (shape, required, allowed dtypes) of layer i's packed experts."""
    D, I = spec.hidden_size, spec.moe.intermediate_size
    want = {}
    for e, name in enumerate(formats):
        f, n = parse_name(name), expert_names(names, i, e)
        for w, (rows, cols) in (("w13", (2 * I, D)), ("w2", (D, I))):
            data, dtype, scale = f.packed_shapes(rows, cols)
            want[n[w]] = (data, True, (dtype,))
            if scale is not None:
                want[n[w + "_scale"]] = (scale, True, ("F32",))
    return want
