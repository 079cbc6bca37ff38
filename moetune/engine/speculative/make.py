"""`engine.speculative` → its speculator."""

from __future__ import annotations

from moetune.config import SpeculativeSpec
from moetune.engine.speculative.base import Speculator
from moetune.engine.speculative.ngram import NgramSpeculator


def make_speculator(spec: SpeculativeSpec) -> Speculator:
    return NgramSpeculator(spec.k, spec.max_ngram, spec.min_ngram)
