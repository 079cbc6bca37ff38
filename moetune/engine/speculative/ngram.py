"""Prompt lookup (n-gram) drafting: the tokens that followed the latest earlier occurrence of the
sequence's last n tokens, longest n first (n = max_ngram .. min_ngram). Needs no model and no
state: code, quotes and repetitive text continue what the prompt or the output already said.

min_ngram is 2 by default: on the bundled model over 16 held-out code prompts (48 tokens each,
k = 4) 1-gram matches brought acceptance down from 47 % to 29 % (tokens per verify 2.59 → 1.99)
for verify steps that cost as much as good ones."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from moetune.engine.sequence import Sequence
from moetune.engine.speculative.base import Draft


class NgramSpeculator:
    def __init__(self, k: int, max_ngram: int = 3, min_ngram: int = 2):
        self.k, self.max_ngram, self.min_ngram = k, max_ngram, min_ngram

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        return [Draft(lookup(seq.token_ids(0, seq.num_tokens), limit, self.max_ngram, self.min_ngram)
                      if limit > 0 else [])
                for seq, limit in zip(seqs, limits)]

    def accepted(self, seq: Sequence, num_accepted: int) -> None:
        pass

    def forget(self, seq: Sequence) -> None:
        pass


def lookup(tokens: list[int], k: int, max_ngram: int, min_ngram: int = 1) -> list[int]:
    """Up to k tokens that followed the latest earlier match of the last n tokens (n from max_ngram
    down to min_ngram); [] when no such suffix occurs earlier."""
    L = len(tokens)
    if L < 2 or k < 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)  # [L]
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        windows = sliding_window_view(arr[: L - 1], n)  # [L - n, n]: windows starting at 0 .. L-n-1
        hits = np.flatnonzero((windows == arr[L - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the token after the latest match
            return arr[start : start + k].tolist()
    return []
