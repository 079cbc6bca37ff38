"""StepBatch: what one forward step computes, as the engine's ModelRunner built it.

Tokens of all sequences are flattened to [T], sequence after sequence; sequences that compute one
token attending to their cache (decodes) come first, so attention runs them as one batch. The KV
cache is paged: `slot_mapping` says where each new token's keys/values go, `block_tables` where
each sequence's earlier tokens are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class StepKind(enum.Enum):
    PREFILL = "prefill"  # every sequence computes prompt tokens (a whole prompt or a chunk)
    DECODE = "decode"  # every sequence computes the one token it sampled last step
    MIXED = "mixed"  # prefill chunks beside decodes (chunked prefill)


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    query_lens: list[int]  # new tokens per sequence (sum = T)
    context_lens: list[int]  # tokens in the cache per sequence after this step
    slot_mapping: torch.Tensor  # [T] flat cache row of each new token: block * block_size + offset
    block_tables: torch.Tensor  # [B, max_blocks] cache blocks of each sequence (padded with 0)
    kind: StepKind = StepKind.PREFILL
    num_single: int = 0  # leading sequences with one query token (attention batches them)
    _tensors: dict = field(default_factory=dict, repr=False)  # per-step values built once, shared by layers

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    def memo(self, key, make):
        """make() the first time a layer asks for `key` in this step, the same object after (values
        every layer derives from the step alike, such as the decode attention plan)."""
        if key not in self._tensors:
            self._tensors[key] = make()
        return self._tensors[key]

    def context_tensor(self) -> torch.Tensor:  # [B]
        if "ctx" not in self._tensors:
            self._tensors["ctx"] = torch.tensor(self.context_lens, device=self.input_ids.device)
        return self._tensors["ctx"]

    def starts(self) -> list[int]:
        if "starts" not in self._tensors:
            out, acc = [], 0
            for q in self.query_lens:
                out.append(acc)
                acc += q
            self._tensors["starts"] = out
        return self._tensors["starts"]

    def row_tables(self) -> torch.Tensor:
        """[T, max_blocks] each row's sequence's block table (a sequence's rows repeat its table)."""
        if "row_tables" not in self._tensors:
            lens = torch.tensor(self.query_lens, device=self.block_tables.device)  # [B]
            self._tensors["row_tables"] = self.block_tables.repeat_interleave(lens, dim=0)
        return self._tensors["row_tables"]

    def last_token_index(self) -> torch.Tensor:
        """Index in [T] of each sequence's last token: the rows whose logits sample the next token."""
        ends = torch.tensor(self.query_lens, device=self.input_ids.device).cumsum(0) - 1
        return ends  # [B]
