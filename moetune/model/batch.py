"""StepBatch: what one forward step computes. Tokens of all sequences are flattened to [T]."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    query_lens: list[int]  # new tokens per sequence (sum = T)
    context_lens: list[int]  # tokens in the cache per sequence after this step
    slots: list[int]  # KV-cache slot per sequence

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)

    def starts(self) -> list[int]:
        out, acc = [], 0
        for q in self.query_lens:
            out.append(acc)
            acc += q
        return out

    def last_token_index(self) -> torch.Tensor:
        """Index in [T] of each sequence's last token: the rows whose logits sample the next token."""
        ends = torch.tensor(self.query_lens, device=self.input_ids.device).cumsum(0) - 1
        return ends  # [B]
