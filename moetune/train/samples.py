"""Deterministic artefacts drawn from the held-out split: prompts (jsonl) and a perplexity sample.

Prompts: for i in range(n), file = heldout[i % n_files] (sorted relpaths); a seeded
``random.Random(seed)`` picks a target length in [min_chars, max_chars] and a start line among
"statement starts" (lines whose stripped text starts with def/class/@/if/for/import/...); the prompt
is the whole lines from there while the text stays <= the target length, ending with '\\n'.
Eval sample: for each held-out file in sorted order, its first ``piece_chars`` characters cut back
to the last line end, each piece followed by the EOS token text.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

STARTS = ("def ", "class ", "@", "if ", "for ", "while ", "return", "import ", "from ",
          "with ", "try:", "#", "async def ")


def start_lines(lines: list[str]) -> list[int]:
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith(STARTS):
            out.append(i)
    return out


def take_lines(lines: list[str], start: int, max_chars: int) -> str:
    text = ""
    for line in lines[start:]:
        if len(text) + len(line) + 1 > max_chars:
            break
        text += line + "\n"
    return text


def make_prompts(heldout: list[str], texts: list[str], n: int, seed: int,
                 min_chars: int = 16, max_chars: int = 400) -> list[dict]:
    rng = random.Random(seed)
    prompts, seen, i = [], set(), 0
    while len(prompts) < n and i < 50 * n:
        k = i % len(heldout)
        i += 1
        lines = texts[k].split("\n")
        cands = start_lines(lines)
        target = rng.randint(min_chars, max_chars)
        if not cands:
            continue
        text = take_lines(lines, rng.choice(cands), target)
        if len(text.strip()) < min_chars or text in seen:
            continue
        seen.add(text)
        prompts.append({"id": f"stdlib-heldout-{len(prompts):04d}", "prompt": text,
                        "source": heldout[k], "chars": len(text)})
    return prompts


def write_jsonl(rows: list[dict], path: Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def make_eval_sample(texts: list[str], piece_chars: int, eos_text: str) -> str:
    pieces = []
    for text in texts:
        piece = text[:piece_chars]
        if len(text) > piece_chars:
            piece = piece[: piece.rfind("\n") + 1]
        if piece.strip():
            pieces.append(piece + eos_text)
    return "".join(pieces)
