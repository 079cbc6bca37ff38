"""One request being generated: its tokens, its stop conditions, its detokenised text, and where
the engine stands with it (status, tokens whose KV is computed, its KV blocks)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from moetune.engine.detokenize import IncrementalText
from moetune.engine.sampling import SamplingParams, make_generator


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted and to be recomputed)
    RUNNING = "running"  # owns KV blocks; prefilling or decoding
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    max_len: int  # prompt + completion may not exceed this (the context limit)
    priority: int = 0  # lower runs first; equal priorities are first come, first served
    arrival: int = 0  # admission order (the engine's request counter)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    generator: torch.Generator | None = None
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    in_prefill: bool = True  # computing known tokens (prompt, or all tokens after a preemption)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache hash of each full, computed block
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    last_experts: frozenset[int] | None = None  # keys layer_row·E + expert its last computed token chose
    draft_ids: list[int] = field(default_factory=list)  # tokens a speculator guessed follow (verified next step)
    draft_probs: torch.Tensor | None = None  # [len(draft_ids), V] the draft's distributions; None: deterministic
    _text: IncrementalText = field(init=False)  # the completion's text, extended token by token

    def __post_init__(self):
        self.generator = make_generator(self.params.seed)
        self._text = IncrementalText(self.params.stop)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_remaining(self) -> int:
        """Known tokens whose KV is not computed yet (1 for a decoding sequence)."""
        return self.num_tokens - self.num_computed_tokens

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output."""
        P = len(self.prompt_ids)
        if end <= P:
            return self.prompt_ids[start:end]
        if start >= P:
            return self.output_ids[start - P : end - P]
        return self.prompt_ids[start:] + self.output_ids[: end - P]

    @property
    def text(self) -> str:
        """The completion text so far, stop string excluded."""
        return self._text.text

    def append(self, token: int, decode) -> str:
        """Add a sampled token, extend the text, set finish_reason; return the new visible text.

        `decode(ids) -> str` is the tokenizer's; None computes no text. The work per token does not
        grow with the output (engine/detokenize.py)."""
        self.output_ids.append(token)
        if token in self.eos_ids and not self.params.ignore_eos:
            self.output_ids.pop()
            self.finish_reason = "stop"
            return self._text.flush()
        last = len(self.output_ids) >= self.params.max_tokens or self.num_tokens >= self.max_len
        delta, stopped = self._text.extend(self.output_ids, decode, last)
        if stopped:
            self.finish_reason = "stop"
        elif last:
            self.finish_reason = "length"
        return delta
