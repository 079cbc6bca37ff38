"""IncrementalText: one sequence's completion text, extended token by token with work that does not
grow with the length of the output.

Per new token: two short decodes (`_decode_new`), a search for the stop strings in the held-back
tail plus the new characters only, and an append to a list of pieces. Nothing re-reads the whole
output, so a 2,000-token completion costs per token what a 20-token one does
(benchmarks/bench_detokenize.py).

The result is exactly the text of decoding the whole output at once and cutting it at the first
stop string (`tests/engine/test_detokenize.py`): multi-byte characters split over tokens wait for
their last byte (a decode ending in U+FFFD is held, unless it is the last token), and a tail that
may still grow into a stop string is held back until it cannot.
"""

from __future__ import annotations

from typing import Callable

Decode = Callable[[list[int]], str]


class IncrementalText:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self._pieces: list[str] = []  # visible text, in order (joined on demand)
        self._text: str | None = ""  # the joined pieces, or None when a piece came since
        self._held = ""  # decoded text not shown yet: it may be the start of a stop string
        self._prefix = 0  # output tokens [prefix, read) are the context of the next decode
        self._read = 0  # output tokens before this are decoded

    @property
    def text(self) -> str:
        """The visible completion (stop string excluded)."""
        if self._text is None:
            self._text = "".join(self._pieces)
        return self._text

    def extend(self, ids: list[int], decode: Decode | None, last: bool) -> tuple[str, bool]:
        """ids: the whole output so far (its newest token unseen); last: no token follows.
        → (the text now visible that was not before, a stop string was found)."""
        new = self._decode_new(ids, decode, last) if decode is not None else ""
        pending = self._held + new
        cut = min((i for i in (pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return self._show(pending[:cut]), True
        keep = 0 if last else _stop_prefix_len(pending, self.stops)
        self._held = pending[len(pending) - keep:] if keep else ""
        return self._show(pending[: len(pending) - keep]), False

    def flush(self) -> str:
        """The sequence ended without a new token (an end-of-sequence token): show what was held."""
        held, self._held = self._held, ""
        return self._show(held)

    def _show(self, piece: str) -> str:
        if piece:
            self._pieces.append(piece)
            self._text = None
        return piece

    def _decode_new(self, ids: list[int], decode: Decode, last: bool) -> str:
        """The characters the tokens from `_read` on add, or "" while they end inside a UTF-8 character.

        Two short windows are decoded, both starting at the same earlier token (so a tokenizer that
        treats the first token of a decode specially, such as SentencePiece's leading space, treats
        both alike): the text the new tokens add is the second's text past the first's."""
        known = decode(ids[self._prefix : self._read])
        grown = decode(ids[self._prefix :])
        if grown.endswith("\ufffd") and not last:
            return ""
        if len(grown) <= len(known):  # (a token may decode to nothing, a skipped special one: wait)
            return ""
        self._prefix, self._read = self._read, len(ids)
        return grown[len(known) :]


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
