"""How long one request may be, as one rule for the engine (`Engine.max_len`, its `add_request` check) and
for the commands that refuse a prompt before any model loads (cli/generate.py through `Target.max_len`).
Torch-free."""

from __future__ import annotations

from moetune.config import EngineConfig


def max_len_of(engine: EngineConfig, max_position: int) -> int:
    """Tokens one sequence may hold, prompt and output: the model's context, cut to engine.max_model_len."""
    return min(max_position, engine.max_model_len or max_position)


def context_words(engine: EngineConfig, max_position: int) -> str:
    """How a refusal names the context `max_len_of` gives: the model's, or engine.max_model_len's where the
    recipe cuts it."""
    cut = max_len_of(engine, max_position) < max_position
    return "engine.max_model_len's context" if cut else "the model's context"


def prompt_refusal(num_tokens: int, max_len: int) -> str | None:
    """Why a prompt of `num_tokens` can never run in a context of `max_len` (at least one token must
    follow it), or None."""
    if num_tokens >= max_len:
        return f"the prompt has {num_tokens} tokens but the context is {max_len}; shorten the prompt"
    return None
