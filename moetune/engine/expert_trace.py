"""ExpertTraces: each computed token's routing (MoE layer × top-k expert ids, int16), kept beside its
KV entry in the paged cache's block, and the history hints that predict a sequence's next experts.

Layout: one array [num_blocks + 1, block_size, Lm, K] (block 0 is the cache's null block), so a
token's trace lives exactly as long as its KV: a block handed out again is overwritten by its new
tokens (freed with the KV), and a prefix-cache hit shares the block — its traces come with it
(copied with prefix-cached blocks, at no cost). -1 marks a position never written.

History hint: a decoding sequence's next token is predicted to use, in each MoE layer, the experts
its last HISTORY tokens chose (their union); the engine hands the union over the step's decodes to
the offload store before the forward (`ExpertStore.hint`), which queues them for its prefetch thread.
"""

from __future__ import annotations

import numpy as np

from moetune.engine.sequence import Sequence

HISTORY = 2  # tokens of a sequence's trace whose experts predict its next token's


class ExpertTraces:
    def __init__(self, num_blocks: int, block_size: int, num_moe_layers: int, top_k: int):
        self.block_size = block_size
        self.ids = np.full((num_blocks + 1, block_size, num_moe_layers, top_k), -1, dtype=np.int16)

    def write(self, seq: Sequence, start: int, ids: np.ndarray) -> None:
        """ids [n, Lm, K]: the routing of the sequence's tokens start .. start + n − 1."""
        bs = self.block_size
        pos = np.arange(start, start + ids.shape[0])  # [n]
        blocks = np.asarray(seq.block_table, dtype=np.int64)[pos // bs]  # [n]
        self.ids[blocks, pos % bs] = ids

    def read(self, seq: Sequence, start: int, stop: int) -> np.ndarray:
        """[stop − start, Lm, K] of tokens start .. stop − 1 (−1 where never written)."""
        bs = self.block_size
        pos = np.arange(start, stop)
        return self.ids[np.asarray(seq.block_table, dtype=np.int64)[pos // bs], pos % bs]

    def predict(self, seqs: list[Sequence]) -> list[set[int]]:
        """Per MoE layer, the experts the last HISTORY computed tokens of `seqs` chose (their union)."""
        Lm = self.ids.shape[2]
        out: list[set[int]] = [set() for _ in range(Lm)]
        for seq in seqs:
            stop = seq.num_computed_tokens
            if stop == 0:
                continue
            recent = self.read(seq, max(0, stop - HISTORY), stop)  # [h, Lm, K]
            for j in range(Lm):
                out[j].update(int(e) for e in np.unique(recent[:, j]) if e >= 0)
        return out
