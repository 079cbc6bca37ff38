"""A layer's routed experts read from a checkpoint: stacked in the load dtype (over this rank's slots
under a placement), or packed as `moetune quantize` stored them. Used by the loader and by
`moetune quantize` (which packs the stacked experts)."""

from __future__ import annotations

import torch

from moetune.experts.mixed import from_packed, packed_slots
from moetune.experts.store import ExpertWeights, SlotMap
from moetune.kernels.quant_formats import PackedWeight, plain
from moetune.model.naming import TensorNames
from moetune.model.quant_checkpoint import expert_names
from moetune.model.weights import WeightSource
from moetune.moe.placement import Placement
from moetune.quant.formats import parse_format
from moetune.spec import ModelSpec


def read_experts(source: WeightSource, names: TensorNames, spec: ModelSpec, i: int,
             placement: Placement | None = None, rank: int = 0) -> ExpertWeights:
    """Layer i's routed experts stacked over this rank's slots: w13 [P_local, 2I, D] (gate rows, then
    up rows), w2 [P_local, D, I]; all E in logical order without a placement."""
    held = list(range(spec.moe.num_experts)) if placement is None else placement.rank_experts(i, rank)
    fused_w13, fused_w2 = names.fused_experts(i)
    if source.has(fused_w13):
        w13, w2 = source.get(fused_w13), source.get(fused_w2)
        if placement is not None:
            index = torch.tensor(held, device=w13.device)
            w13, w2 = w13.index_select(0, index), w2.index_select(0, index)  # [P_local, ...] copies
    else:
        I, D = spec.moe.intermediate_size, spec.hidden_size
        w13 = torch.empty(len(held), 2 * I, D, device=source.device, dtype=source.dtype)
        w2 = torch.empty(len(held), D, I, device=source.device, dtype=source.dtype)
        for slot, e in enumerate(held):
            w13[slot, :I] = source.get(names.expert(i, e, "gate"))  # [I, D]
            w13[slot, I:] = source.get(names.expert(i, e, "up"))  # [I, D]
            w2[slot] = source.get(names.expert(i, e, "down"))  # [D, I]
    if placement is None:
        return ExpertWeights.dense(w13, w2)
    return ExpertWeights(plain(w13), plain(w2), placement.slot_map(i, source.device))


def read_packed_layer(source: WeightSource, names: TensorNames, spec: ModelSpec, i: int,
                      formats: tuple[str, ...], held: list[int] | None = None,
                      slots: SlotMap | None = None) -> ExpertWeights:
    """Layer i's experts as stored by `moetune quantize` → ExpertWeights (format groups). With a
    placement: `held` = the logical expert of each of this rank's slots (sorted by format,
    `Placement.by_format`) and `slots` its slot map; each expert is read once, a replica shares it."""
    per_expert = {}
    for e in (range(len(formats)) if held is None else sorted(set(held))):
        fmt, n = parse_format(formats[e]), expert_names(names, i, e)
        per_expert[e] = tuple(_packed(source, n[w], n[w + "_scale"], fmt) for w in ("w13", "w2"))
    if held is None:
        return from_packed([per_expert[e] for e in range(len(formats))], formats)
    return packed_slots([per_expert[e] for e in held], [formats[e] for e in held], slots)


def _packed(source: WeightSource, data_name: str, scale_name: str, fmt) -> PackedWeight:
    data = source.raw(data_name).to(source.device)[None]  # [1, N, ·]
    scale = source.raw(scale_name).to(source.device, torch.float32)[None] if fmt.group or fmt.dtype is None else None
    return PackedWeight(data, scale, fmt.kind, fmt.group)
