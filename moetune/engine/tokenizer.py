"""Tokenizer and chat template from the checkpoint directory (transformers' AutoTokenizer, offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from moetune.errors import CheckpointError
from moetune.spec import ModelSpec


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer  # heavy import: only when a command tokenizes

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot load a tokenizer from {model_dir}: {first}") from None


def eos_ids(tokenizer, config_eos: tuple[int, ...]) -> frozenset[int]:
    ids = set(config_eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def encode_prompt(tokenizer, prompt: str | list[int], bos: int | None, eos: frozenset[int]) -> list[int]:
    """A prompt's token ids as the engine runs it (ids pass as given): special tokens as the tokenizer adds
    them, not verbose (a text longer than the context, which eval windows, is no warning); an empty prompt
    → [BOS] (else an EOS id, else 0)."""
    ids = list(prompt) if isinstance(prompt, list) else tokenizer.encode(prompt, verbose=False)
    if not ids:
        ids = [bos if bos is not None else next(iter(eos), 0)]
    return ids


def load_encoder(model_dir: Path, spec: ModelSpec) -> tuple[object, Callable[[str | list[int]], list[int]]]:
    """(the checkpoint's tokenizer, its encode) without the model: the ids a Generator on this checkpoint
    runs for a prompt (`Generator.encode`), for the commands that refuse a prompt before the model loads."""
    tokenizer = load_tokenizer(model_dir)
    eos = eos_ids(tokenizer, spec.eos_token_ids)
    return tokenizer, lambda prompt: encode_prompt(tokenizer, prompt, spec.bos_token_id, eos)


def apply_chat_template(tokenizer, messages: list[dict]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        return "\n".join(m["content"] for m in messages) + "\n"
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
