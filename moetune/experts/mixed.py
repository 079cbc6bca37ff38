"""Per-expert precision in one layer: experts packed in their own formats, stored as format groups.

Slots are ordered by format (first appearance of the format in expert order), experts of one
format keeping their logical order; the slot map sends logical expert e to its slot. A layer in
one format keeps the identity map (slot e = expert e) and one group.
"""

from __future__ import annotations

import torch

from moetune.experts.store import ExpertWeights, FormatGroup, SlotMap
from moetune.kernels.quant_formats import PackedWeight
from moetune.quant.formats import parse_format, pack


def slot_order(formats: list[str] | tuple[str, ...]) -> list[list[int]]:
    """Logical experts grouped by format, groups in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for e, name in enumerate(formats):
        groups.setdefault(name, []).append(e)
    return list(groups.values())


def stack_packed(ws: list[PackedWeight]) -> PackedWeight:
    """Per-expert PackedWeights [1, N, ·] (one format) → one [n, N, ·]."""
    first = ws[0]
    data = torch.cat([w.data for w in ws])
    scale = None if first.scale is None else torch.cat([w.scale for w in ws])
    return PackedWeight(data, scale, first.fmt, first.group_size)


def from_packed(per_expert: list[tuple[PackedWeight, PackedWeight]], formats: list[str] | tuple[str, ...]
                ) -> ExpertWeights:
    """Experts already packed (w13 [1, 2I, D], w2 [1, D, I] each, in `formats[e]`) → ExpertWeights."""
    order = slot_order(formats)
    groups, start = [], 0
    for experts in order:
        w13 = stack_packed([per_expert[e][0] for e in experts])
        w2 = stack_packed([per_expert[e][1] for e in experts])
        groups.append(FormatGroup(start, start + len(experts), w13, w2))
        start += len(experts)
    return ExpertWeights.from_groups(groups, _slot_map([e for g in order for e in g], per_expert[0][0].data.device))


def quantized_layer(w13: torch.Tensor, w2: torch.Tensor, formats: list[str] | tuple[str, ...]) -> ExpertWeights:
    """w13 [E, 2I, D], w2 [E, D, I] float → ExpertWeights with expert e in `formats[e]`."""
    groups, start = [], 0
    order = slot_order(formats)
    for experts in order:
        fmt = parse_format(formats[experts[0]])
        index = torch.tensor(experts, device=w13.device)
        g13 = pack(w13.index_select(0, index), fmt)  # [n, 2I, D]
        g2 = pack(w2.index_select(0, index), fmt)  # [n, D, I]
        groups.append(FormatGroup(start, start + len(experts), g13, g2))
        start += len(experts)
    return ExpertWeights.from_groups(groups, _slot_map([e for g in order for e in g], w13.device))


def format_runs(slot_formats: list[str] | tuple[str, ...]) -> list[tuple[int, int]]:
    """Slots [start, stop) of equal format, in slot order; each format must be one run (a rank's
    slots sorted by format: `Placement.by_format`)."""
    runs: list[tuple[int, int]] = []
    for s, name in enumerate(slot_formats):
        if runs and slot_formats[runs[-1][0]] == name:
            runs[-1] = (runs[-1][0], s + 1)
        else:
            runs.append((s, s + 1))
    names = [slot_formats[a] for a, _ in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"slots are not sorted by format: {list(slot_formats)}")
    return runs


def quantized_slots(w13: torch.Tensor, w2: torch.Tensor, slot_formats: list[str] | tuple[str, ...],
                    slots: SlotMap) -> ExpertWeights:
    """A rank's slots (a replica is a copy of its expert) w13 [P_local, 2I, D], w2 [P_local, D, I] float,
    already sorted by format, slot s packed in `slot_formats[s]` → ExpertWeights over the placement's `slots`."""
    groups = []
    for a, b in format_runs(slot_formats):
        fmt = parse_format(slot_formats[a])
        groups.append(FormatGroup(a, b, pack(w13[a:b], fmt), pack(w2[a:b], fmt)))  # [b - a, ...]
    return ExpertWeights.from_groups(groups, slots)


def packed_slots(per_slot: list[tuple[PackedWeight, PackedWeight]], slot_formats: list[str] | tuple[str, ...],
                 slots: SlotMap) -> ExpertWeights:
    """A rank's slots already packed (w13 [1, 2I, D], w2 [1, D, I] each), sorted by format → ExpertWeights."""
    groups = [FormatGroup(a, b, stack_packed([w[0] for w in per_slot[a:b]]), stack_packed([w[1] for w in per_slot[a:b]]))
              for a, b in format_runs(slot_formats)]
    return ExpertWeights.from_groups(groups, slots)


def _slot_map(slot_expert: list[int], device) -> SlotMap:
    """slot_expert[s] = logical expert in slot s → SlotMap (identity when already in order)."""
    E = len(slot_expert)
    if slot_expert == list(range(E)):
        return SlotMap(E)
    slot_of = torch.empty(E, dtype=torch.int64)
    slot_of[torch.tensor(slot_expert)] = torch.arange(E)
    return SlotMap(E, E, slot_of[:, None].to(device), torch.ones(E, dtype=torch.int64, device=device))
