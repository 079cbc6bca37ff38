"""Expert tensor parallelism for packed (quantized) experts: a rank's slice of each format group.

A quantized expert is packed whole (its scales are those of the one-rank model) and then sliced, so
rank t's w13 rows and w2 columns carry exactly the bytes and scales the one-rank model holds for
them: w13 [n, 2I, D] keeps its gate rows [t·I/G, (t+1)·I/G) and the same up rows (per-row and
per-group scales go with their rows); w2 [n, D, I] keeps columns [t·I/G, (t+1)·I/G) — a per-row
scale (int8, fp8) is the whole row's, unchanged; int4 keeps whole groups, so I/G must be a
multiple of the group (`check_groups`).
"""

from __future__ import annotations

import torch

from moetune.experts.store import ExpertWeights, FormatGroup
from moetune.kernels.quant_formats import PackedWeight, WeightFormat
from moetune.model.tp import TPPlan
from moetune.model.tp_check import TPError


def check_groups(names: list[str], intermediate: int, G: int) -> None:
    """int4 groups must not straddle two ranks' columns of w2. int8: a rank's columns should be whole
    blocks of the CPU integer path's x rounding (`kernels.cpu.linear.X_BLOCK`), else each rank rounds
    its slice of the activation on its own and the mesh differs from one rank within `q8_bound`
    (warned, not refused)."""
    import warnings

    from moetune.kernels.cpu.linear import X_BLOCK
    from moetune.quant.formats import parse_format

    for name in names:
        group = parse_format(name).group
        if group and (intermediate // G) % group:
            raise TPError(f"--expert-tp-size {G} splits the expert intermediate size {intermediate} into "
                          f"{intermediate // G} columns per rank, not a multiple of {name}'s group of {group}")
        if name == "int8" and (intermediate // G) % X_BLOCK:
            warnings.warn(f"--expert-tp-size {G}: {intermediate // G} int8 columns per rank is not a multiple of "
                          f"{X_BLOCK}; the CPU integer path rounds each rank's activation slice on its own, so the "
                          f"ranks' sum differs from one rank's by up to the rounding bound", stacklevel=2)


def shard_experts(weights: ExpertWeights, plan: TPPlan) -> ExpertWeights:
    """Rank plan.rank's slice of every format group (the slot map is unchanged)."""
    groups = [FormatGroup(g.start, g.stop, _rows(g.w13, plan), _cols(g.w2, plan)) for g in weights.groups]
    return ExpertWeights.from_groups(groups, weights.slots)


def _rows(w13: PackedWeight, plan: TPPlan) -> PackedWeight:
    """[n, 2I, ·]: this rank's gate rows, then its up rows."""
    I = w13.out_features // 2
    a, b = plan.part(I)
    index = torch.cat([torch.arange(a, b), torch.arange(I + a, I + b)]).to(w13.data.device)

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(1, index).contiguous()

    return PackedWeight(pick(w13.data), pick(w13.scale), w13.fmt, w13.group_size)


def _cols(w2: PackedWeight, plan: TPPlan) -> PackedWeight:
    """[n, D, I]: this rank's columns (packed int4 bytes and group scales cut at group boundaries)."""
    a, b = plan.part(w2.in_features)
    scale = w2.scale
    if w2.fmt == WeightFormat.INT4:
        data = w2.data[:, :, a // 2 : b // 2]
        scale = scale[:, :, a // w2.group_size : b // w2.group_size]
    else:
        data = w2.data[:, :, a:b]
    return PackedWeight(data.contiguous(), None if scale is None else scale.contiguous(), w2.fmt, w2.group_size)
