"""One request being generated: its tokens, its stop conditions, its detokenised text, and where
the engine stands with it (status, tokens whose KV is computed, its KV blocks)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

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
    text: str = ""  # completion text, stop string excluded
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    generator: torch.Generator | None = None
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    in_prefill: bool = True  # computing known tokens (prompt, or all tokens after a preemption)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache hash of each full, computed block
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    _decoded: str = ""  # the whole output detokenised so far (stop strings not cut), see `_detokenize`
    _prefix_offset: int = 0  # output tokens [prefix, read) are the context window of the next decode
    _read_offset: int = 0  # output tokens before this are in `_decoded`

    def __post_init__(self):
        self.generator = make_generator(self.params.seed)

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

    def append(self, token: int, decode) -> str:
        """Add a sampled token, update the text, set finish_reason; return the new visible text."""
        self.output_ids.append(token)
        if token in self.eos_ids and not self.params.ignore_eos:
            self.output_ids.pop()
            self.finish_reason = "stop"
            return ""
        full = self._detokenize(decode) if decode is not None else ""
        if full is None:
            return ""  # an incomplete UTF-8 sequence: wait for the next byte token
        for stop in self.params.stop:
            cut = full.find(stop)
            if cut >= 0:
                full, self.finish_reason = full[:cut], "stop"
        if self.finish_reason is None and (
            len(self.output_ids) >= self.params.max_tokens or self.num_tokens >= self.max_len
        ):
            self.finish_reason = "length"
        if self.finish_reason is None:  # hold back a tail that may still grow into a stop string
            full = full[: len(full) - _stop_prefix_len(full, self.params.stop)]
        delta = full[len(self.text):] if full.startswith(self.text) else full
        self.text = full
        return delta

    def _detokenize(self, decode) -> str | None:
        """The whole output as text, extended by the newest tokens only; None while they end inside a
        UTF-8 character (unless the output is at max_tokens).

        Decoding the whole output at every step is O(n²) over a generation: a 2,000-token
        completion decodes 2,000 tokens per step. Instead two short windows are decoded, both
        starting at the same earlier token (so a tokenizer that treats the first token of a decode
        specially, such as SentencePiece's leading space, treats both alike): the text the new
        tokens add is the second's text past the first's."""
        ids = self.output_ids
        known = decode(ids[self._prefix_offset : self._read_offset])
        grown = decode(ids[self._prefix_offset :])
        if grown.endswith("\ufffd") and len(ids) < self.params.max_tokens:
            return None
        if len(grown) > len(known):  # (a token may decode to nothing, a skipped special one: wait)
            self._decoded += grown[len(known) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        return self._decoded


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
