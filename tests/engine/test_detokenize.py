"""Incremental detokenisation (`Sequence._detokenize`) gives, token by token, exactly the text of
decoding the whole output at once: byte-level BPE with multi-byte characters split over tokens,
a SentencePiece-style tokenizer (leading-space marker), special tokens that decode to nothing."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from moetune.engine.sampling import SamplingParams
from moetune.engine.sequence import Sequence

CORPUS = ["naïve café — déjà vu 東京タワー ☃ snowman", "the quick brown fox jumps over the lazy dog",
          "Ünïcödé çhäråcters: 日本語のテキスト and emoji 🚀🔥", "def f(x):\n    return x ** 2  # ok"] * 20


def _byte_level() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _metaspace() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<eos>"]
                                                        + [f"<0x{i:02X}>" for i in range(256)]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")


@pytest.mark.parametrize("make", [_byte_level, _metaspace])
@pytest.mark.parametrize("seed", range(4))
def test_token_by_token_text_equals_one_decode_of_the_whole_output(make, seed):
    tok = make()
    rng = random.Random(seed)
    text = " ".join(rng.choice(CORPUS) for _ in range(3))
    ids = tok.encode(text)
    if seed % 2:  # random tokens too: byte tokens that split characters, special tokens
        ids = ids + [rng.randrange(tok.vocab_size) for _ in range(40)]
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731  (what the engine passes)
    seq = Sequence(0, [1], SamplingParams(max_tokens=len(ids), ignore_eos=True), frozenset(), 10_000)
    streamed = ""
    for i, t in enumerate(ids):
        streamed += seq.append(t, decode)
        visible = decode(ids[: i + 1])
        if not visible.endswith("\ufffd"):
            assert seq.text == visible  # nothing held back without stop strings
    assert streamed == seq.text == decode(ids)


def test_stop_string_cuts_the_incremental_text():
    tok = _byte_level()
    ids = tok.encode("the quick brown fox jumps over the lazy dog")
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
    seq = Sequence(0, [1], SamplingParams(max_tokens=100, stop=("fox",)), frozenset(), 10_000)
    streamed = "".join(seq.append(t, decode) for t in ids if not seq.finished)
    assert seq.finish_reason == "stop" and streamed == seq.text == "the quick brown "


def _long_output(tok, seed: int, n: int = 1000) -> list[int]:
    """n tokens: corpus text (multi-byte characters over several byte tokens) with random tokens
    mixed in (byte tokens that split characters, special tokens that decode to nothing)."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n:
        ids += tok.encode(rng.choice(CORPUS) + " ")
        ids += [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(4))]
    return ids[:n]


def _stream(ids, decode, stops=(), eos=frozenset()):
    seq = Sequence(0, [1], SamplingParams(max_tokens=len(ids), stop=tuple(stops)), frozenset(eos), 10_000)
    pieces = []
    for t in ids:
        if seq.finished:
            break
        pieces.append(seq.append(t, decode))
    return seq, "".join(pieces)


@pytest.mark.parametrize("make", [_byte_level, _metaspace])
@pytest.mark.parametrize("seed", range(3))
def test_a_1000_token_completion_is_byte_identical_to_the_full_decode(make, seed):
    tok = make()
    ids = _long_output(tok, seed)
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
    full = decode(ids)
    assert any(ord(c) > 0x7F for c in full)
    seq, streamed = _stream(ids, decode)
    assert streamed.encode() == seq.text.encode() == full.encode()
    assert seq.finish_reason == "length" and len(seq.output_ids) == 1000


def _boundaries(tok, ids) -> list[int]:
    """Character offsets in the full decode where one token's text ends and the next begins."""
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
    return sorted({len(decode(ids[:i])) for i in range(1, len(ids)) if not decode(ids[:i]).endswith("\ufffd")})


@pytest.mark.parametrize("make", [_byte_level, _metaspace])
@pytest.mark.parametrize("seed", range(3))
def test_stop_strings_spanning_tokens_cut_a_1000_token_completion_exactly(make, seed):
    tok = make()
    ids = _long_output(tok, 10 + seed, n=1000)
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
    full = decode(ids)
    rng = random.Random(seed)
    cuts = [b for b in _boundaries(tok, ids[:900]) if b > len(full) // 2]
    at = rng.choice(cuts)
    stop = full[at - 3 : at + 4]  # 7 characters across a token boundary, late in the output
    decoy = stop[:-1] + "\x00"  # a stop that never matches, but whose prefixes do all along
    seq, streamed = _stream(ids, decode, stops=(decoy, stop))
    want = full[: full.find(stop)]
    assert streamed.encode() == seq.text.encode() == want.encode()
    assert seq.finish_reason == "stop"
    # it stopped at the first token whose text completes the stop string, or, when that token ends
    # inside a multi-byte character, at the token that completes the character
    m = next(i for i in range(1, len(ids) + 1) if stop in decode(ids[:i]))
    n = next(i for i in range(m, len(ids) + 1) if not decode(ids[:i]).endswith("\ufffd"))
    assert len(seq.output_ids) == n


@pytest.mark.parametrize("make", [_byte_level, _metaspace])
def test_end_of_sequence_shows_a_tail_held_back_for_a_stop_string(make):
    tok = make()
    ids = tok.encode("the quick brown fox jumps")
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
    eos = tok.convert_tokens_to_ids("<eos>")
    seq, streamed = _stream(ids + [eos], decode, stops=("jumps over",), eos={eos})
    assert seq.finish_reason == "stop" and streamed == seq.text == decode(ids)
