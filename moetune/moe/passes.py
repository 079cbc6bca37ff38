"""The MoE phases over a subset of a step's token copies: how a capacity limit saves or spends time.

With a capacity set (moe/capacity.py) the layer no longer sends every copy through one pass:
  pass 1   the copies within capacity (at most C per expert): permute → dispatch → experts →
           combine, each phase timed under its own name;
  pass 2   `buffer` only: the copies beyond capacity, through the same four phases within the same
           step, timed together as the phase `overflow` (so the per-phase times never overlap).
Copies beyond capacity under `drop` (and `reroute`'s leftovers) are in neither pass: they do not
travel and are not computed, and their output row is zero (their weight is 0 too). Both passes
end in one `unpermute` over all T·K copies, in copy order, so `buffer` gives the output of no
capacity limit and `drop` the output of zero-weight copies.

A pass is a one-choice permute (K = 1) over the pass's copies, each a row of its token, with its
physical slot taken from the whole step's slot map (a replica is chosen by the token's index, as
without capacity). Under expert parallelism every rank runs the same number of passes (pass 2 may
be empty: its all-to-alls still run), so the collectives of the ranks line up.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from moetune.experts.store import ExpertWeights
from moetune.moe.backend import MoEBackend
from moetune.moe.dispatch import Dispatcher
from moetune.moe.permute import PermuteOutput
from moetune.moe.unpermute import copy_order
from moetune.probe import Probe, phase_scope


class PassOutput(NamedTuple):
    copies: torch.Tensor  # [N] the pass's flat copy indices t·K + k, increasing
    y: torch.Tensor  # [N, D] expert output of each of them, in that order
    perm: PermuteOutput  # the pass's permute (counts per physical slot of its copies)
    block_m: int
    bytes_sent: tuple[int, int]  # (dispatch, combine) bytes that left this rank


def run_pass(x: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor, num_slots: int, weights: ExpertWeights,
             backend: MoEBackend, dispatcher: Dispatcher, probe: Probe | None, layer: int) -> PassOutput:
    """x [T, D]; mask [T·K] bool: the copies of this pass; slots [T, K] physical slot of every copy.
    Picking the copies is part of `permute`, putting their outputs back in copy order part of `combine`. `probe` None runs the phases untimed (the caller times
    the pass as one phase)."""
    K = slots.shape[1]
    with phase_scope(probe, layer, "permute"):
        copies = torch.nonzero(mask).squeeze(1)  # [N]
        rows = x.index_select(0, torch.div(copies, K, rounding_mode="floor"))  # [N, D]
        perm = backend.permute(rows, slots.reshape(-1).index_select(0, copies)[:, None], num_slots)  # K = 1
    with phase_scope(probe, layer, "dispatch"):
        sent = dispatcher.dispatch(perm)
    with phase_scope(probe, layer, "experts"):
        computed = backend.experts(sent.x, sent.offsets, weights)
    with phase_scope(probe, layer, "combine"):
        back = dispatcher.combine(computed.y, sent)
        y = copy_order(back.y_sorted, perm.sorted_copy_ids)  # [N, D] in the order of `copies`
    return PassOutput(copies, y, perm, computed.block_m, (sent.bytes_sent, back.bytes_sent))


def gather_passes(passes: list[PassOutput], num_copies: int, like: torch.Tensor) -> torch.Tensor:
    """The passes' outputs in copy order [T·K, D]; a copy in no pass (dropped) gets a zero row."""
    out = like.new_zeros(num_copies, like.shape[1])  # [T*K, D]
    for p in passes:
        if p.copies.numel():
            out.index_copy_(0, p.copies, p.y)
    return out
