"""Jobs run on every rank by the distributed tests (module level: spawned ranks unpickle them)."""

from __future__ import annotations

import os

from moetune.engine.sampling import SamplingParams


def parity(prompts: list[list[int]], max_tokens: int, dp):
    """Prompt logits and greedy completions; rank 0 returns them (the others None)."""
    logits = dp.prompt_logits(prompts)
    done = dp.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    if dp.rank != 0:
        return None
    return logits, [c.token_ids for c in done], dp.idle_steps


def die_on(rank: int, prompts: list[list[int]], dp):
    """Rank `rank` exits abruptly after its first lock-step; the others go on."""
    dp.step()
    if dp.rank == rank:
        os._exit(3)
    return dp.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
