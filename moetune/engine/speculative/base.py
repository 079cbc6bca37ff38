"""The speculator interface: before each step, draft up to k tokens for each decoding sequence;
after it, hear how many the target model accepted.

A draft is a guess at the tokens that follow a sequence's known tokens. The engine feeds the
sequence's last token and its draft through the target model in one step (k + 1 query rows over
the paged KV cache) and keeps the longest prefix of the draft the target agrees with
(`verify.py`), plus one token of its own, so every step yields 1 to k + 1 tokens per sequence. A
speculator that drafts nothing for a sequence leaves it an ordinary one-token decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from moetune.engine.sequence import Sequence


@dataclass
class Draft:
    tokens: list[int]  # the guessed continuation, at most the k asked for
    probs: torch.Tensor | None = None  # [len(tokens), V] the draft distribution each was drawn from; None: deterministic


class Speculator(Protocol):
    """Drafts tokens for decoding sequences. `propose` is told, per sequence, the most tokens worth
    drafting (k, or fewer near the sequence's length limit); `accepted` and `forget` let a
    speculator with per-sequence state (a draft model's KV cache) follow what the target kept."""

    k: int  # the most draft tokens per sequence and step

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]: ...

    def accepted(self, seq: Sequence, num_accepted: int) -> None: ...

    def forget(self, seq: Sequence) -> None: ...



@runtime_checkable
class HiddenStateSpeculator(Protocol):
    """A speculator that drafts from the target's hidden states (MTP: speculative/mtp.py): after
    every step the engine hands it the step's schedule, batch and hidden states [T, D]."""

    def observe(self, sched, batch, hidden: torch.Tensor) -> None: ...
