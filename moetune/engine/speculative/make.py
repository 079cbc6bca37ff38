"""`engine.speculative` → its speculator."""

from __future__ import annotations

from moetune.config import SpeculativeSpec
from moetune.engine.speculative.base import Speculator
from moetune.engine.speculative.ngram import NgramSpeculator


def make_speculator(spec: SpeculativeSpec, model, max_seqs: int, max_len: int, engine_class,
                    runner=None) -> Speculator:
    """The speculator for a target `model` (a draft model loads on its device, in its dtype, and
    runs in an `engine_class` of its own; an MTP module shares the target `runner`'s block pool)."""
    if spec.method == "ngram":
        return NgramSpeculator(spec.k, spec.max_ngram, spec.min_ngram)
    if spec.method == "mtp":
        from moetune.engine.speculative.mtp import MTPSpeculator
        from moetune.model.loader import load_mtp

        return MTPSpeculator(spec.k, load_mtp(model), runner.cache.num_blocks, runner.block_size, max_seqs,
                             runner.build_batch, runner.experts)
    from moetune.engine.speculative.check import draft_errors
    from moetune.engine.speculative.draft import DraftModelSpeculator
    from moetune.model.loader import load_model
    from moetune.model.registry import resolve_model

    with draft_errors():
        draft = load_model(resolve_model(spec.path), model.dtype, model.device)
    return DraftModelSpeculator(spec.k, draft, model.spec.vocab_size, max_seqs, max_len, engine_class)
