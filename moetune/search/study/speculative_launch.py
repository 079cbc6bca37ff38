"""The recipe's `engine.speculative` as vLLM and SGLang flags (flag_tables/*.json).

| moetune | vLLM 0.33.0 | SGLang 0.5.23 |
|---|---|---|
| ngram:K (suffix of 3, else 2 tokens, looked up in the sequence's own tokens) | `--speculative-config '{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 2}'` | `--speculative-algorithm NGRAM --speculative-num-draft-tokens K+1` (the chain counts its root, the last verified token) `--speculative-ngram-min-bfs-breadth 1 --speculative-ngram-max-bfs-breadth 1` (one chain, as moetune drafts) |
| draft:DIR:K (K greedy tokens of a smaller checkpoint) | `--speculative-config '{"model": DIR, "num_speculative_tokens": K}'` | `--speculative-algorithm STANDALONE --speculative-draft-model-path DIR --speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1` |
| mtp:K (the checkpoint's MTP layer, chained K times) | `--speculative-config '{"method": "mtp", "num_speculative_tokens": K}'` | `--speculative-algorithm EAGLE --speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1` (EAGLE = NEXTN: the target's own MTP layer, no draft path) |

Speculation IS priced (search/cost/speculative.py: the verify step's B·(k + 1) rows through
attention, the MoE layers — the experts the trace's rows wake at that row count — and the LM head,
the drafter's passes, and the accepted tokens per step from the trace's measured acceptance, else
--spec-acceptance, labelled assumed), so the figures of a winner with `engine.speculative` include
it. Where an engine has no flag for a parameter the gap is listed (`gaps`) under "NOT as priced":
the engine drafts differently there, so its acceptance may differ from the priced one; it is not
re-priced (the simulator has moetune's speculators only). DIR is the
recipe's draft checkpoint, resolved by the study (`ServeTarget.speculative`), or the placeholder
$DRAFT_DIR where the model was scaled (the recipe's draft does not fit the model served).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from moetune.config import SpeculativeSpec

DRAFT_PLACEHOLDER = "$DRAFT_DIR"


@dataclass
class SpeculativeFlags:
    flags: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)  # parameters with no flag (priced as moetune drafts, not re-priced)
    notes: list[str] = field(default_factory=list)


def describe(spec: SpeculativeSpec) -> str:
    """The recipe value back: 'ngram:4' | 'draft:DIR:3' | 'mtp:2'."""
    return f"draft:{spec.path}:{spec.k}" if spec.method == "draft" else f"{spec.method}:{spec.k}"


MTP_NOTE = ("MTP: the engine reads the checkpoint's own MTP layer (num_nextn_predict_layers) through a model class "
            "of its own for the architecture (DeepSeek-V3 and a few others); a checkpoint of another architecture "
            "with an MTP layer in DeepSeek's layout, such as moetune's bundled qwen3_moe, has none there")


def vllm_speculative(spec: SpeculativeSpec | None) -> SpeculativeFlags:
    out = SpeculativeFlags()
    if spec is None:
        return out
    if spec.method == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": spec.k, "prompt_lookup_max": spec.max_ngram,
                  "prompt_lookup_min": spec.min_ngram}
        out.gaps.append(f"n-gram match choice: moetune drafts after the latest earlier occurrence of the longest "
                        f"matching suffix ({spec.min_ngram}..{spec.max_ngram} tokens); vLLM after the earliest "
                        "(no flag)")
    elif spec.method == "mtp":
        config = {"method": "mtp", "num_speculative_tokens": spec.k}
        out.notes.append(MTP_NOTE)
    else:
        config = {"model": spec.path, "num_speculative_tokens": spec.k}
        out.notes.append("draft model: vLLM drafts greedily with it on the target's GPUs, as moetune's draft:DIR:K "
                         "does; it must share the target's tokenizer")
    out.flags = ["--speculative-config", json.dumps(config)]
    return out


def sglang_speculative(spec: SpeculativeSpec | None, attn_dp: bool) -> SpeculativeFlags:
    out = SpeculativeFlags()
    if spec is None:
        return out
    if spec.method == "ngram":
        out.flags = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(spec.k + 1),
                     "--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1"]
        out.gaps.append(f"n-gram lookup in the sequence's own tokens, suffixes of {spec.min_ngram}..{spec.max_ngram} "
                        "tokens: SGLang's NGRAM matches in a trie over every request's tokens "
                        "(--speculative-ngram-capacity, --speculative-ngram-max-trie-depth) and has no "
                        "match-length flag")
    elif spec.method == "mtp":
        out.flags = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(spec.k),
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(spec.k + 1)]
        out.notes.append(MTP_NOTE)
    else:
        out.flags = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", spec.path,
                     "--speculative-num-steps", str(spec.k), "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", str(spec.k + 1)]
    out.notes.append(f"--speculative-num-draft-tokens {spec.k + 1}: SGLang counts the last verified token in the "
                     f"chain it verifies, so {spec.k + 1} is moetune's k = {spec.k} drafted tokens")
    if attn_dp:
        out.notes.append("SGLang refuses NGRAM / STANDALONE with DP attention at startup in some versions (a check "
                         "after its argument parser, not in the flag table); drop --attn-dp-size if it does")
    return out
