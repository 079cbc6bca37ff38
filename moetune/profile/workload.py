"""The profiling workload: which prompts, how many requests, batch size and lengths.

Prompts come from a JSONL file (one object with a "prompt" field per line; the bundled
`stdlib-heldout.jsonl` by default) or a plain-text file (one prompt per non-empty line).
Requests cycle through the prompts. With `input_len`, each prompt's tokens are cut to that many,
or padded by repeating the prompt's own tokens until they reach it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from moetune.errors import MoetuneError


@dataclass(frozen=True)
class Workload:
    prompts: str | None = None  # file path; None = the bundled held-out prompts
    num_requests: int = 64
    batch_size: int = 8
    input_len: int | None = None  # tokens per prompt (truncate / pad); None = as tokenized
    output_len: int = 64  # tokens generated per request (EOS ignored, so exactly this many)
    warmup_steps: int = 2  # steps run before measuring, on the first batch, excluded from figures

    @property
    def real_batch_size(self) -> int:
        """The largest batch actually run: never more than there are requests."""
        return min(self.batch_size, self.num_requests)

    def num_batches(self) -> int:
        return -(-self.num_requests // self.batch_size)

    def measured_steps(self) -> int:
        return self.num_batches() * self.output_len  # one prefill + (output_len - 1) decodes per batch

    def check(self) -> None:
        for name in ("num_requests", "batch_size", "output_len"):
            if getattr(self, name) < 1:
                raise MoetuneError(f"--{name.replace('_', '-')} must be at least 1")
        if self.input_len is not None and self.input_len < 1:
            raise MoetuneError("--input-len must be at least 1")
        if self.warmup_steps < 0:
            raise MoetuneError("--warmup-steps must be 0 or more")


def prompts_path(workload: Workload) -> Path:
    if workload.prompts is not None:
        return Path(workload.prompts)
    from moetune.model.registry import bundled_asset

    return bundled_asset("prompts/stdlib-heldout.jsonl")


def load_prompt_texts(path: Path) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MoetuneError(f"cannot read prompts file '{path}': {getattr(exc, 'strerror', None) or exc}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise MoetuneError(f"prompts file '{path}' has no prompts")
    if str(path).endswith(".jsonl") or lines[0].lstrip().startswith("{"):
        return [_jsonl_prompt(path, n, line) for n, line in enumerate(lines, 1)]
    return lines


def _jsonl_prompt(path: Path, lineno: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise MoetuneError(f"prompts file '{path}' line {lineno} is not JSON: {exc.msg}") from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise MoetuneError(f"prompts file '{path}' line {lineno} has no string field 'prompt'")
    try:
        record["prompt"].encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MoetuneError(f"prompts file '{path}' line {lineno}: 'prompt' holds a lone surrogate "
                           f"(\\u{ord(record['prompt'][exc.start]):04x}), which is not text") from None
    return record["prompt"]


def request_tokens(texts: list[str], encode: Callable[[str], list[int]], workload: Workload) -> list[list[int]]:
    """Token ids of each request: prompts cycled to num_requests, then cut or padded to input_len."""
    encoded = [encode(t) for t in texts[: workload.num_requests]]
    requests = [encoded[i % len(encoded)] for i in range(workload.num_requests)]
    if workload.input_len is None:
        return requests
    n = workload.input_len
    return [(ids * (n // len(ids) + 1))[:n] for ids in requests]


def batches(requests: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    return [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]
