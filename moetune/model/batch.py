"""StepBatch: what one forward step computes. Tokens of all sequences are flattened to [T]."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    query_lens: list[int]  # new tokens per sequence (sum = T)
    context_lens: list[int]  # tokens in the cache per sequence after this step
    slots: list[int]  # KV-cache slot per sequence
    _tensors: dict = field(default_factory=dict, repr=False)  # per-step values built once, shared by layers

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)

    def slot_tensor(self) -> torch.Tensor:  # [B]
        if "slots" not in self._tensors:
            self._tensors["slots"] = torch.tensor(self.slots, device=self.input_ids.device)
        return self._tensors["slots"]

    def context_tensor(self) -> torch.Tensor:  # [B]
        if "ctx" not in self._tensors:
            self._tensors["ctx"] = torch.tensor(self.context_lens, device=self.input_ids.device)
        return self._tensors["ctx"]

    def slot_range(self) -> range | None:
        """The slots as a contiguous range (cache reads become views), or None; computed once per step."""
        if "range" not in self._tensors:
            span = range(self.slots[0], self.slots[0] + len(self.slots))
            self._tensors["range"] = span if self.slots == list(span) else None
        return self._tensors["range"]

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
