"""Byte-level BPE tokenizer trained with the `tokenizers` library, saved for transformers.

The first special token (``<|endoftext|>``, id 0) is EOS, BOS and PAD, and separates documents.
No post-processor: encoding never adds special tokens.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: list[str],
              min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE on texts (deterministic for a given input order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def to_hf(tok: Tokenizer, eos_token: str, model_max_length: int):
    """Wrap as transformers.PreTrainedTokenizerFast with eos = bos = pad = eos_token."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token,
        bos_token=eos_token,
        pad_token=eos_token,
        unk_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tok: Tokenizer, out_dir: Path, eos_token: str, model_max_length: int) -> None:
    """Write tokenizer.json + tokenizer_config.json (+ special_tokens_map.json if produced)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    to_hf(tok, eos_token, model_max_length).save_pretrained(str(out_dir))
    cfg_path = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # loadable by transformers 4.x and 5.x
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def encode_docs(tok: Tokenizer, docs: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
