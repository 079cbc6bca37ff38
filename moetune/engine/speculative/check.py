"""engine.speculative's mistakes that the checkpoints' config.json show, found where the target is
resolved (engine/target.py), before any model loads or kernel compiles: `mtp:K` on a checkpoint without
an MTP layer, `draft:DIR:K` whose DIR is no checkpoint or whose vocabulary is not the target's.

The speculators raise the same lines from the same rules (make.py, draft.py, model/loader.py's
load_mtp) for callers that build an Engine on a model directly. Torch-free."""

from __future__ import annotations

import contextlib
from typing import Iterator

from moetune.config import parse_speculative
from moetune.errors import CheckpointError, MoetuneError
from moetune.model.checkpoint import Checkpoint, mtp_config, open_checkpoint


def check_speculative(text: str | None, target: Checkpoint) -> None:
    """`text` (engine.speculative, already a valid form) against the target checkpoint."""
    if text is None:
        return
    spec = parse_speculative(text)
    if spec.method == "mtp":
        mtp_config(target.model_dir)
    elif spec.method == "draft":
        with draft_errors():
            draft = open_checkpoint(spec.path)  # config.json and the safetensors headers: no tensor read
        check_draft_vocab(draft.spec.vocab_size, target.spec.vocab_size)


@contextlib.contextmanager
def draft_errors() -> Iterator[None]:
    """A checkpoint mistake of the draft model, named as the draft's."""
    try:
        yield
    except CheckpointError as exc:
        raise CheckpointError(f"engine.speculative's draft model: {exc}") from None


def check_draft_vocab(draft_vocab: int, target_vocab: int) -> None:
    if draft_vocab != target_vocab:
        raise MoetuneError(f"the draft model's vocabulary has {draft_vocab:,} tokens, the target's "
                           f"{target_vocab:,}: a draft model must share the target's tokenizer")
