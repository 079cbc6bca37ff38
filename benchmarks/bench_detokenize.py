"""Time per generated token of the completion text vs output length: incremental vs whole-output decode.

A sequence's text is extended token by token (`Sequence.append`, engine/detokenize.py) with the
bundled model's tokenizer, over a 4,000-token output (the tokenizer's encoding of this repository's
Python source with multi-byte text mixed in) and two stop strings that never match but whose
prefixes do, so that the hold-back runs all along. The other side of the A/B is what a server
without incremental detokenization does per token: decode the whole output, search it for the stop
strings. Rounds alternate the two; each prints the median µs per token over output positions
[a, a+100) for a few a, medians over rounds with min-max across rounds.

    python benchmarks/bench_detokenize.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

BUCKETS = (0, 500, 1000, 2000, 3900)  # output positions a: tokens [a, a+100) are timed
LENGTH = 4000
STOPS = ("\n\n\n\n#", "éé€")


def output_ids(tok) -> list[int]:
    root = Path(__file__).resolve().parents[1] / "moetune"
    text = "".join(p.read_text() + "\nnaïve café — déjà vu 東京タワー 🚀\n" for p in sorted(root.rglob("*.py")))
    return tok.encode(text[:60_000])[:LENGTH]


def incremental(ids, decode) -> list[float]:
    from moetune.engine.sampling import SamplingParams
    from moetune.engine.sequence import Sequence

    seq = Sequence(0, [1], SamplingParams(max_tokens=len(ids), stop=STOPS), frozenset(), 10**6)
    times = []
    for t in ids:
        start = time.perf_counter()
        seq.append(t, decode)
        times.append(time.perf_counter() - start)
    assert seq.text == decode(ids), "the incremental text differs from the full decode"
    return times


def whole(ids, decode) -> list[float]:
    times = []
    for i in range(1, len(ids) + 1):
        start = time.perf_counter()
        text = decode(ids[:i])
        [text.find(s) for s in STOPS]
        times.append(time.perf_counter() - start)
    return times


def per_bucket(times: list[float]) -> list[float]:
    return [statistics.median(times[a : a + 100]) * 1e6 for a in BUCKETS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from moetune.engine.tokenizer import load_tokenizer
    from moetune.model.registry import resolve_model

    tok = load_tokenizer(resolve_model("stdlib-moe"))
    decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731  (what the engine passes)
    ids = output_ids(tok)
    assert len(ids) == LENGTH
    rows: dict[str, list[list[float]]] = {"incremental": [], "whole output": []}
    for _ in range(args.rounds):
        rows["incremental"].append(per_bucket(incremental(ids, decode)))
        rows["whole output"].append(per_bucket(whole(ids, decode)))
    print(f"µs per token at output position (median of {args.rounds} rounds, min-max across rounds); "
          f"load {Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"{'':14}" + "".join(f"{f'[{a}, {a + 100})':>26}" for a in BUCKETS))
    for name, rounds in rows.items():
        cells = []
        for j in range(len(BUCKETS)):
            col = [r[j] for r in rounds]
            cells.append(f"{statistics.median(col):9.1f} ({min(col):6.1f}-{max(col):6.1f})")
        print(f"{name:14}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
