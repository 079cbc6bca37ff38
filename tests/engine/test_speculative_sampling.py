"""Speculative sampling keeps the target distribution exactly (engine/speculative/verify.py).

On a vocabulary of 5 tokens, a two-token "generation" is drawn many times: one verify of a
2-token draft, and when it yields one token only, the second from the target as the next step
would. The joint frequencies of (first, second) must match p(a) · p(b | a) of the target alone
(temperature, top-k and top-p applied) under a chi-square test; with deterministic drafts (n-gram:
accept d with p(d)) and drafts drawn from a distribution q (accept with min(1, p/q)). A verifier
that always accepted, or resampled from p instead of the residual, fails these bounds (checked).
"""

import pytest
import torch

from moetune.engine.sampling import SamplingParams, target_probs
from moetune.engine.speculative.base import Draft
from moetune.engine.speculative.verify import verify, verify_greedy

V, N = 5, 12000

G = torch.Generator().manual_seed(0)
ROW0 = torch.randn(V, generator=G) * 1.5  # the target's logits for the first token [V]
ROW1 = torch.randn(V, V, generator=G) * 1.5  # [V (first token), V]: the second token's, given the first
Q0 = torch.softmax(torch.randn(V, generator=G), -1)  # a draft model's distributions [V]
Q1 = torch.softmax(torch.randn(V, V, generator=G), -1)  # [V, V]

PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.8),
          SamplingParams(temperature=1.3, top_k=3), SamplingParams(temperature=0.9, top_p=0.6, top_k=4)]


def _expected(params: SamplingParams) -> torch.Tensor:
    p0 = target_probs(ROW0, params)  # [V]
    p1 = torch.stack([target_probs(ROW1[a], params) for a in range(V)])  # [V, V]
    return p0[:, None] * p1  # [V, V]


def _draws(params: SamplingParams, with_q: bool, verifier=verify) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V, V)
    for i in range(N):
        if with_q:
            d0 = int(torch.multinomial(Q0, 1, generator=gen))
            d1 = int(torch.multinomial(Q1[d0], 1, generator=gen))
            draft = Draft([d0, d1], torch.stack([Q0, Q1[d0]]))
        else:  # a deterministic guess that varies (as n-gram drafts do between sequences)
            d0, d1 = i % V, (i // V) % V
            draft = Draft([d0, d1])
        logits = torch.stack([ROW0, ROW1[d0], ROW1[d1]])  # [3, V]: row i after the first i draft tokens
        out = verifier(logits, draft, params, gen)
        if len(out) == 1:  # rejected at once: the next step samples the second token from the target
            out.append(int(torch.multinomial(target_probs(ROW1[out[0]], params), 1, generator=gen)))
        counts[out[0], out[1]] += 1
    return counts


def _chi_square_p(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    """p-value of Pearson's chi-square over the cells the target can produce."""
    keep = expected_p.flatten() > 0
    assert counts.flatten()[~keep].sum() == 0  # never a token top-k / top-p removed
    exp = expected_p.flatten()[keep] * counts.sum()
    stat = float(((counts.flatten()[keep] - exp) ** 2 / exp).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.parametrize("with_q", [False, True], ids=["deterministic-draft", "draft-distribution"])
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"t{p.temperature}-p{p.top_p}-k{p.top_k}")
def test_speculative_sampling_reproduces_the_target_distribution(params, with_q):
    assert _chi_square_p(_draws(params, with_q), _expected(params)) > 1e-4


def _always_accept(logits, draft, params, generator):
    return list(draft.tokens) + [int(torch.multinomial(target_probs(logits[-1], params), 1, generator=generator))]


def _resample_from_p(logits, draft, params, generator):
    """Accepts like the real verifier but draws a rejected position from p, not the residual."""
    out = []
    for i, d in enumerate(draft.tokens):
        p = target_probs(logits[i], params)
        q_d = 1.0 if draft.probs is None else float(draft.probs[i][d])
        if float(torch.rand((), generator=generator)) * q_d < float(p[d]):
            out.append(d)
            continue
        out.append(int(torch.multinomial(p, 1, generator=generator)))
        return out
    return out + [int(torch.multinomial(target_probs(logits[len(out)], params), 1, generator=generator))]


@pytest.mark.parametrize("wrong", [_always_accept, _resample_from_p])
def test_the_bound_catches_a_wrong_verifier(wrong):
    params = SamplingParams(temperature=1.0)
    assert _chi_square_p(_draws(params, True, wrong), _expected(params)) < 1e-6


def test_greedy_verification_keeps_the_agreeing_prefix_and_adds_the_targets_token():
    logits = torch.full((4, V), -1.0)
    for row, best in enumerate([3, 1, 4, 0]):
        logits[row, best] = 1.0  # argmax of each row
    assert verify_greedy(logits, [3, 1, 4]) == [3, 1, 4, 0]  # all accepted + the bonus token
    assert verify_greedy(logits, [3, 2, 4]) == [3, 1]  # the second disagrees: the target's own
    assert verify_greedy(logits, [0, 1, 4]) == [3]
    assert verify(logits[:1], Draft([]), SamplingParams(), None) == [3]  # no draft: a plain decode
