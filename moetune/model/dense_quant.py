"""Weight-only int8 / int4 for the dense projections: every linear outside the expert store.

The parts: attention (GQA's fused QKV and o; MLA's fused q/kv down-projection, q up-projection
and o), dense-layer MLPs, shared-expert MLPs and the LM head. Each weight [N, K] becomes a
`PackedWeight` in the experts' own formats (`moetune.quant.formats`: int8 with a scale per output
row, int4 with a scale per group of G columns) and runs through `model/linear.py`'s `project`:
the CPU small-M kernel on decode-shaped steps, its dequantised twin elsewhere. Left float: the
embedding (rows are gathered, not streamed), MLA's kv_b (read as per-head einsum factors), the
router and the shared-expert gate (routing decisions), the norms.

Two ways in: a checkpoint written by `moetune quantize --dense FORMAT` stores the packed weights
(`quant_checkpoint.py`; `linear_weight` reads one back), or a recipe's `quant.dense: FORMAT` packs a
float model's projections on load (`quantize_dense`). Per-row scales make packing commute with
joining rows, so packing q, k, v apart (the checkpoint) and packing the fused QKV (on load) store
the same bytes.
"""

from __future__ import annotations

import torch

from moetune.kernels.quant_formats import PackedWeight, WeightFormat
from moetune.model.attention import GQAAttention
from moetune.model.linear import Weight
from moetune.model.mla import MLAttention
from moetune.model.mlp import GatedMLP
from moetune.model.quant_checkpoint import packed_names
from moetune.model.weights import WeightSource
from moetune.moe.layer import MoELayer
from moetune.quant.formats import format_of, pack, parse_format
from moetune.quant.names import QuantError, parse_dense

PARTS = ("attention", "dense_mlp", "shared_expert", "lm_head")  # the parts `dense_precision` names


def pack_weight(w: torch.Tensor, name: str, what: str) -> PackedWeight:
    """A float weight [N, K] → packed in `name` (int8 | int4-gG); an int4 group that does not divide
    K is one QuantError naming the weight."""
    f = parse_dense(name)
    f.check_dim(w.shape[-1], f"the in-features of {what}")
    return pack(w.float(), parse_format(f.name))


def linear_weight(source: WeightSource, name: str) -> Weight:
    """Checkpoint weight `name` (`P.weight`): the float tensor, or the packed pair `P.qweight` /
    `P.scales` that `moetune quantize --dense` stored instead (its format read from the dtypes)."""
    q, s = packed_names(name)
    if source.has(name) or not source.has(q):
        return source.get(name)
    data, scale = source.raw(q).to(source.device), source.raw(s).to(source.device, torch.float32)
    if data.dtype == torch.int8:
        return PackedWeight(data, scale, WeightFormat.INT8)
    return PackedWeight(data, scale, WeightFormat.INT4, 2 * data.shape[1] // scale.shape[1])


def quantize_dense(model, name: str) -> None:
    """Pack every dense projection of a loaded float model in `name`, in place (the LM head gets its
    own packed copy when it is the tied embedding)."""
    parse_dense(name)
    for layer in model.layers:
        for what, owner, attr in dense_slots(layer):
            w = getattr(owner, attr)
            if not isinstance(w, PackedWeight):
                setattr(owner, attr, pack_weight(w, name, f"layer {layer.index} {what}"))
    if not isinstance(model.lm_head, PackedWeight):
        model.lm_head = pack_weight(model.lm_head, name, "the LM head")


def dense_precision(model) -> dict[str, str]:
    """Part → the format of its weights ('int8', 'int4-g64', 'fp32', 'bf16', ...; 'mixed' when the
    layers differ); parts the model does not have are left out."""
    seen: dict[str, set[str]] = {}
    for layer in model.layers:
        for what, owner, attr in dense_slots(layer):
            seen.setdefault(what.split(".")[0], set()).add(_name(getattr(owner, attr)))
    seen["lm_head"] = {_name(model.lm_head)}
    return {part: (names.pop() if len(names) == 1 else "mixed") for part in PARTS if (names := seen.get(part))}


def packed_weights(model) -> list[PackedWeight]:
    """Every packed dense projection weight of the model (the LM head included)."""
    out = [getattr(owner, attr) for layer in model.layers for _, owner, attr in dense_slots(layer)] + [model.lm_head]
    return [w for w in out if isinstance(w, PackedWeight)]


def _name(w: Weight) -> str:
    if isinstance(w, PackedWeight):
        return format_of(w)
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(w.dtype, str(w.dtype))


def dense_slots(layer) -> list[tuple[str, object, str]]:
    """(part.name, object, attribute) of each dense projection weight of a decoder layer."""
    out = []
    attn = layer.attention
    if isinstance(attn, GQAAttention):
        out += [("attention.qkv", attn.qkv, "weight"), ("attention.o", attn.o, "weight")]
    elif isinstance(attn, MLAttention):
        out += [("attention.x_a", attn.x_a, "weight"), ("attention.q_b", attn.q_b, "weight"),
                ("attention.o", attn.o, "weight")]
    else:
        raise QuantError(f"layer {layer.index}: no dense quantization for {type(attn).__name__}")
    mlp = layer.mlp
    if isinstance(mlp, GatedMLP):
        out += [("dense_mlp.w13", mlp, "w13"), ("dense_mlp.w2", mlp, "w2")]
    elif isinstance(mlp, MoELayer) and mlp.shared is not None:
        inner = mlp.shared.mlp
        out += [("shared_expert.w13", inner, "w13"), ("shared_expert.w2", inner, "w2")]
    return out


__all__ = ["PARTS", "dense_slots", "packed_weights", "dense_precision", "linear_weight", "pack_weight", "quantize_dense"]
