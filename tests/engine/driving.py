"""Driving an Engine step by step in tests: mixed requests, requests arriving at given steps, and the pool's state after."""

import random

from moetune.engine.engine import Engine
from moetune.engine.sampling import SamplingParams


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def run_arrivals(engine: Engine, requests, arrivals: list[int]) -> list[list[int]]:
    """Add request i (prompt, max_tokens) at step arrivals[i]; step until all finish; token ids per request."""
    tokens: dict[int, list[int]] = {}
    rid_of: dict[int, int] = {}
    step = 0
    while len(rid_of) < len(requests) or engine.has_unfinished():
        for i, at in enumerate(arrivals):
            if at == step:
                rid_of[i] = engine.add_request(requests[i][0], greedy(requests[i][1]))
        for out in engine.step():
            tokens.setdefault(out.request_id, []).append(out.new_token)
        step += 1
    return [tokens[rid_of[i]] for i in range(len(requests))]


def all_free(engine: Engine) -> bool:
    """Every KV block back in the pool, none referenced."""
    return engine.blocks.num_free == engine.blocks.num_blocks and not any(engine.blocks.ref_counts)


def mixed_requests(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """n (prompt, output length): a random phrase of 1–40 tokens repeated up to 300 tokens (some
    prompts share a 64-token prefix), outputs of 1–32 tokens."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(64)]
    out = []
    for i in range(n):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 40))]
        prompt = (phrase * rng.randint(1, 8))[: rng.randint(1, 300)]
        out.append(((shared + prompt) if i % 4 == 0 else prompt, rng.randint(1, 32)))
    return out
