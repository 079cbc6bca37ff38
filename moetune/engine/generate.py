"""Generator: batch generation and streaming as thin wrappers over `Engine.step()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from moetune.config import EngineConfig
from moetune.engine.engine import Engine
from moetune.engine.sampling import SamplingParams
from moetune.engine.tokenizer import encode_prompt
from moetune.errors import RequestError
from moetune.model.transformer import MoETransformer


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str


class Generator:
    def __init__(self, model: MoETransformer, tokenizer, eos_ids: frozenset[int], config: EngineConfig = EngineConfig()):
        self.model = model
        self.tokenizer = tokenizer
        self.engine = Engine(model, tokenizer, eos_ids, config)

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.engine.eos_ids

    @eos_ids.setter
    def eos_ids(self, value: frozenset[int]) -> None:
        self.engine.eos_ids = value

    def encode(self, prompt: str | list[int]) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.model.spec.bos_token_id, self.eos_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]) -> list[Completion]:
        """Submit every prompt at once and step until all finish; completions in prompt order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.encode(p) for p in prompts]
        rids = self._add_all(ids, plist)
        seqs = [self.engine.sequence(r) for r in rids]
        while self.engine.has_unfinished():
            self.engine.step()
        failed = [i for i, s in enumerate(seqs) if s.finish_reason == "error"]
        if failed:  # a bug, not the caller's mistake: the engine logged why
            raise RuntimeError(f"prompt {failed[0]} failed in the engine (sampling or stop check); see the log above")
        return [Completion(s.prompt_ids, s.output_ids, s.text, s.finish_reason or "length") for s in seqs]

    def stream(self, prompt: str | list[int], params: SamplingParams) -> Iterator[str]:
        """Yield the completion text of one prompt piece by piece."""
        rid = self._add_all([self.encode(prompt)], [params])[0]
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.request_id == rid and out.text_delta:
                        yield out.text_delta
        finally:
            self.engine.abort(rid)  # a consumer that stops early frees the request's blocks

    def _add_all(self, ids: list[list[int]], params: list[SamplingParams]) -> list[int]:
        rids = []
        try:
            for i, (prompt, p) in enumerate(zip(ids, params)):
                rids.append(self.engine.add_request(prompt, p))
        except RequestError as exc:
            for rid in rids:
                self.engine.abort(rid)
            raise RequestError(f"prompt {i}: {exc}") from None
        return rids
