"""Verification: the target model's logits over a sequence's k + 1 verify rows → the tokens kept.

Row i of the logits ([k + 1, V]) is the target's prediction after the last known token and the
first i draft tokens. Greedy: keep draft tokens while each equals the row's argmax, then add the
argmax of the first row that disagreed (or of row k when all agreed) — the tokens plain greedy
decoding yields. Sampled (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"): accept draft token d of row i with probability min(1, p_i(d) / q_i(d)),
where p_i is the target's distribution after temperature / top-k / top-p (`target_probs`) and
q_i the draft's (one-hot on d for a deterministic draft: accept with p_i(d)); at the first
rejection draw from the residual max(p_i − q_i, 0) normalised; when all k are accepted draw one
more from p_k. Each kept token is then distributed exactly as the target samples it alone.
"""

from __future__ import annotations

import torch

from moetune.engine.sampling import SamplingParams, greedy_tokens, target_probs
from moetune.engine.speculative.base import Draft


def verify(logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator | None) -> list[int]:
    """logits [k + 1, V] fp32 (k = len(draft.tokens)) → the 1 .. k + 1 tokens to append."""
    if params.greedy:
        return verify_greedy(logits, draft.tokens)
    return verify_sampled(logits, draft, params, generator)


def verify_greedy(logits: torch.Tensor, tokens: list[int]) -> list[int]:
    best = greedy_tokens(logits)  # [k + 1]
    out = []
    for d, b in zip(tokens, best):
        if d != b:
            break
        out.append(d)
    out.append(best[len(out)])
    return out


def verify_sampled(logits: torch.Tensor, draft: Draft, params: SamplingParams,
                   generator: torch.Generator | None) -> list[int]:
    out = []
    for i, d in enumerate(draft.tokens):
        p = target_probs(logits[i], params).cpu()  # [V]
        q = None if draft.probs is None else draft.probs[i].to(p)  # [V]
        q_d = 1.0 if q is None else float(q[d])
        u = float(torch.rand((), generator=generator))
        if u * q_d < float(p[d]):  # accept with probability min(1, p(d) / q(d))
            out.append(d)
            continue
        residual = p.clone()  # [V]
        if q is None:
            residual[d] = 0.0
        else:
            residual = (p - q).clamp_min_(0.0)
        total = float(residual.sum())
        dist = residual / total if total > 0 else p  # total 0 only by rounding (p ≈ q): then p itself
        out.append(int(torch.multinomial(dist, 1, generator=generator)))
        return out
    p = target_probs(logits[len(out)], params).cpu()  # every draft token accepted: one more from p_k
    out.append(int(torch.multinomial(p, 1, generator=generator)))
    return out
