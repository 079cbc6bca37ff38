"""Two-batch overlap (SGLang `--enable-two-batch-overlap`, vLLM `--enable-dbo`): each MoE layer's
step is split into two micro-batches A and B of half the rows, so that one's dispatch / combine
runs while the other computes. Not a free lunch: each half runs every GEMM at half the rows (the
weights are read twice: memory-bound phases cost nearly twice as much in total), pays every
kernel launch and every collective's latency twice.

Per MoE layer, stages of one micro-batch (each the slowest rank's): pre = attention + router +
permute, dispatch, experts, combine, post = unpermute + shared expert. Two streams, each in order:

  compute stream: A.pre, B.pre, A.experts, B.experts, A.post, B.post
  comm stream:    A.dispatch, B.dispatch, A.combine, B.combine

each stage starting when its stream is free and its own input is ready (`tbo_layer`, vectorised
over the layers). So a layer lasts at least 2·(pre + experts + post) of a half (the compute stream)
and at least 2·(dispatch + combine) of a half, and at most the two halves back to back
(`serial_layer`): it never beats max(compute, comm) of the whole batch. The first dense layers,
the LM head and the TP collectives are not overlapped.
"""

from __future__ import annotations

import numpy as np


def tbo_layer(pre: np.ndarray, disp: np.ndarray, exp: np.ndarray, comb: np.ndarray, post: np.ndarray) -> np.ndarray:
    """[Lm] seconds of each MoE layer under two-batch overlap; every argument is one half's stage [Lm]."""
    a_pre, b_pre = pre, 2 * pre  # compute stream: end times
    a_disp = a_pre + disp  # comm stream
    b_disp = np.maximum(b_pre, a_disp) + disp
    a_exp = np.maximum(b_pre, a_disp) + exp
    b_exp = np.maximum(a_exp, b_disp) + exp
    a_comb = np.maximum(a_exp, b_disp) + comb
    b_comb = np.maximum(b_exp, a_comb) + comb
    a_post = np.maximum(b_exp, a_comb) + post
    return np.maximum(a_post, b_comb) + post  # B.post ends the layer


def serial_layer(pre, disp, exp, comb, post) -> np.ndarray:
    """[Lm] the two halves back to back (what `step_totals.add_step` prices from the halves' phases)."""
    return 2 * (pre + disp + exp + comb + post)
