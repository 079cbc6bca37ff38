"""The layout of a mixed-precision checkpoint written by `moetune quantize` (torch-free: validation
reads it from config.json and the safetensors headers alone).

config.json gains
  "quantization": {"quant_method": "moetune-experts", "version": 1,
                   "formats": {"<moe layer>": ["<format of expert 0>", ...]},   (optional)
                   "dense": "int8" | "int4-gG"}                                 (optional)
(at least one of the two) and each routed expert e of MoE layer i is stored as
  {moe prefix}experts.{e}.w13.qweight  [2I, D] (int4: [2I, D/2] U8; int8: I8; fp8: F8_E4M3; plain: its float)
  {moe prefix}experts.{e}.w13.scales   [2I] F32 (int8, fp8) | [2I, D/G] F32 (int4-gG) | absent (plain)
  {moe prefix}experts.{e}.w2.qweight   [D, I] likewise,  ….w2.scales [D] | [D, I/G]
(w13 = gate rows, then up rows: each expert's two GEMMs are two contiguous tensors). With "dense",
every dense projection weight `P.weight` [N, K] (`is_dense_linear`: attention, MLA's q/kv down and
q up and o projections, dense and shared-expert MLPs, the LM head) is stored instead as
  P.qweight  [N, K] I8 (int8) | [N, K/2] U8 (int4-gG),   P.scales  [N] F32 | [N, K/G] F32
— a tied LM head as `lm_head.qweight` / `lm_head.scales` beside the float embedding. MLA's kv_b_proj
(read as per-head einsum factors), the router and the shared-expert gate stay float. Everything
else is copied from the source checkpoint unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from moetune.errors import CheckpointError
from moetune.model.naming import TensorNames
from moetune.quant.names import QuantError, parse_dense, parse_name
from moetune.quant.table import PrecisionTable
from moetune.spec import ModelSpec

QUANT_KEY = "quantization"
QUANT_METHOD = "moetune-experts"


def expert_names(names: TensorNames, i: int, e: int) -> dict[str, str]:
    p = f"{names.moe(i)}experts.{e}."
    return {"w13": p + "w13.qweight", "w13_scale": p + "w13.scales", "w2": p + "w2.qweight", "w2_scale": p + "w2.scales"}


def quant_block(table: PrecisionTable | None, dense: str | None = None) -> dict:
    block = {"quant_method": QUANT_METHOD, "version": 1}
    if table is not None:
        block["formats"] = table.to_json()
    if dense is not None:
        block["dense"] = dense
    return block


def is_dense_linear(name: str) -> bool:
    """Whether checkpoint tensor `name` is a dense projection weight `moetune quantize --dense` packs."""
    if name == "lm_head.weight":
        return True
    return (name.endswith(("_proj.weight", "kv_a_proj_with_mqa.weight")) and ".experts." not in name
            and not name.endswith("kv_b_proj.weight"))


def packed_names(name: str) -> tuple[str, str]:
    """`P.weight` → (`P.qweight`, `P.scales`): where a packed dense weight is stored."""
    base = name.removesuffix(".weight")
    return base + ".qweight", base + ".scales"


def dense_format(block: dict | None) -> str | None:
    """The dense projections' format named by a quantization block (None: float)."""
    return None if block is None else block.get("dense")


def read_block(model_dir: Path) -> dict | None:
    """config.json's quantization block, checked for shape (None for a plain checkpoint)."""
    path = Path(model_dir) / "config.json"
    block = json.loads(path.read_text(encoding="utf-8")).get(QUANT_KEY)
    if block is None:
        return None
    if not isinstance(block, dict) or block.get("quant_method") != QUANT_METHOD or not (
            isinstance(block.get("formats"), dict) or "dense" in block):
        raise CheckpointError(f"{path}: '{QUANT_KEY}' is not a moetune quantization block "
                              f"(quant_method '{QUANT_METHOD}' with 'formats' or 'dense'); only moetune quantize's "
                              "output loads")
    dense = block.get("dense")
    if dense is not None:
        try:
            parse_dense(dense)
        except QuantError as exc:
            raise CheckpointError(f"{path}: bad '{QUANT_KEY}' block: {exc}") from None
    return block


def expected_dense(want: dict, dense: str) -> dict:
    """`want` (name → (shape, required[, dtypes]), `validate.expected_tensors`) with every dense
    projection weight replaced by its packed pair; a tied LM head gains its own required pair."""
    f, out = parse_dense(dense), {}
    for name, (shape, required, *dtypes) in want.items():
        if not is_dense_linear(name):
            out[name] = (shape, required, *dtypes)
            continue
        data, dtype, scale = f.packed_shapes(*shape)
        q, s = packed_names(name)
        out[q], out[s] = (data, True, (dtype,)), (scale, True, ("F32",))
    return out


def read_quantization(model_dir: Path, spec: ModelSpec) -> PrecisionTable | None:
    """The checkpoint's precision table of the routed experts from config.json, or None (a plain
    checkpoint, or one whose experts stayed float)."""
    path = Path(model_dir) / "config.json"
    block = read_block(model_dir)
    if block is None or "formats" not in block:
        return None
    if not isinstance(block["formats"], dict):
        raise CheckpointError(f"{path}: bad '{QUANT_KEY}' block: 'formats' is not a table")
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
