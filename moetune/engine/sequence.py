"""One request being generated: its tokens, its stop conditions and its detokenised text."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moetune.engine.sampling import SamplingParams, make_generator


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    max_len: int  # prompt + completion may not exceed this (the KV-cache slot length)
    slot: int = -1
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # completion text, stop string excluded
    finish_reason: str | None = None  # "stop" | "length"
    generator: torch.Generator | None = None

    def __post_init__(self):
        self.generator = make_generator(self.params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token: int, decode) -> str:
        """Add a sampled token, update the text, set finish_reason; return the new visible text."""
        self.output_ids.append(token)
        if token in self.eos_ids and not self.params.ignore_eos:
            self.output_ids.pop()
            self.finish_reason = "stop"
            return ""
        full = decode(self.output_ids)
        if full.endswith("\ufffd") and len(self.output_ids) < self.params.max_tokens:
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


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
