"""Tokenizer and chat template from the checkpoint directory (transformers' AutoTokenizer, offline)."""

from __future__ import annotations

from pathlib import Path

from moetune.errors import CheckpointError


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer  # heavy import: only when a model is loaded

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


def apply_chat_template(tokenizer, messages: list[dict]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        return "\n".join(m["content"] for m in messages) + "\n"
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
