"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, per-sequence seeds.

The sampler is numerically safe for any finite temperature > 0 and any top_p in (0, 1]: the
logits are shifted by their maximum before the division, and the temperature is held at 1e-30 at
least (a temperature of 1e-300 was 0 in float32: inf/inf = NaN; now every token but the most
likely ones gets -inf), and top-p always keeps the most likely token (a top_p below float32's
resolution used to mask every token and divide 0 by 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from moetune.errors import RequestError


MAX_LOGPROBS = 20
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit integer
MIN_TEMPERATURE = 1e-30  # smaller ones sample like it (see `sample`); float32 holds it, 1e-300 is 0 there


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probabilities under the model's distribution (before temperature / top-k / top-p)."""

    logprob: float  # of the sampled token
    top: list[tuple[int, float]]  # the k most likely (token id, logprob), most likely first


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; k = the sampled token's logprob and the k most likely (k <= 20)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise RequestError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise RequestError(f"seed must be in [0, 2^63 - 1 = {MAX_SEED}], got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise RequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """logits [S, V] → the first maximum of each row. fp32 CPU logits go through numpy: torch's CPU
    argmax took 35 µs for one 32,000-wide row and 1 ms for 64 rows on the 2-core machine of issue
    13, numpy's 3 µs and 0.13 ms (the same index: the first maximum, a NaN counting as one)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(dim=-1).tolist()


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [V] fp32 → one token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(target_probs(logits, params).cpu(), 1, generator=generator))


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [V] fp32 → the distribution a non-greedy `sample` draws from (temperature, top-k,
    top-p applied) [V]; speculative verification accepts and resamples against it."""
    # ≤ 0 with the most likely token at 0, so never inf/inf. A temperature below MIN_TEMPERATURE is
    # sampled as 1e-30: logits more than 1e-28 apart then differ by over 100 (a factor e^-100) either
    # way, so only logits closer than that (in practice: equal ones) could be treated differently
    logits = (logits - logits.max()) / max(params.temperature, MIN_TEMPERATURE)  # [V]
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [V]
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (always the top one)."""
    sorted_probs, order = torch.sort(probs, descending=True)  # [V]
    mass_before = torch.cumsum(sorted_probs, 0) - sorted_probs  # [V]
    drop = mass_before >= top_p  # [V]
    drop[0] = False  # the most likely token stays, however small top_p is
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()


def make_generator(seed: int | None) -> torch.Generator | None:
    if seed is None:
        return None
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


def token_logprobs(logits: torch.Tensor, tokens: list[int], ks: list[int]) -> list[TokenLogprobs]:
    """logits [S, V], the token sampled in each row, and how many alternatives each row wants."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [S, V]
    chosen = logp.gather(1, torch.tensor(tokens, device=logp.device).unsqueeze(1)).squeeze(1).tolist()  # [S]
    top = torch.topk(logp, max(max(ks), 1), dim=-1)  # [S, kmax]
    values, ids = top.values.tolist(), top.indices.tolist()
    return [TokenLogprobs(c, list(zip(i[:k], v[:k]))) for c, i, v, k in zip(chosen, ids, values, ks)]
