"""Quality of a deployment (quantized / offloaded) against a reference model, through the engine.

Every forward goes through `ModelRunner.forward_prompts` (one prefill step of fresh sequences) and
`model.logits`; greedy continuations through `Generator.generate`. Nothing builds its own batch.

perplexity       the token stream cut into non-overlapping windows of S tokens (the last kept if
                 it has >= 2); token j >= 1 of a window predicted from tokens 0..j-1 of that window;
                 ppl = exp(Σ NLL / tokens scored) (the protocol of `train/evaluate.py`)
kl               mean over every position of every held-out prompt of KL(p_ref ‖ p_model) of the
                 next-token distributions, in nats
top1_agreement   fraction of those positions whose argmax agrees
greedy_match     fraction of prompts whose greedy continuation of G tokens is identical;
                 greedy_prefix: mean fraction of the G tokens before the first difference
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moetune.engine.generate import Generator
from moetune.engine.sampling import SamplingParams


@dataclass(frozen=True)
class EvalSettings:
    window: int = 512  # S (the bundled model card's eval_sample protocol)
    windows_per_step: int = 4  # windows run as one prefill step
    max_windows: int | None = None  # None: every window of the text
    num_prompts: int = 32
    prompt_tokens: int = 128  # prompts cut to this many tokens
    greedy_tokens: int = 16  # G


def windows(ids: list[int], S: int) -> list[list[int]]:
    out = [ids[i:i + S] for i in range(0, len(ids), S)]
    return [w for w in out if len(w) >= 2]


def _logits(gen: Generator, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Per prompt: logits [n, V] (fp32) of every position, via the engine's runner."""
    hidden = gen.engine.runner.forward_prompts(prompts)  # [T, D]
    logits = gen.model.logits(hidden)  # [T, V]
    return list(torch.split(logits, [len(p) for p in prompts]))


def _runner_fits(gen: Generator, prompts: list[list[int]]) -> None:
    bs, cache = gen.engine.runner.block_size, gen.engine.runner.cache
    need = sum(-(-len(p) // bs) for p in prompts)
    if need > cache.num_blocks:
        raise ValueError(f"{need} KV blocks needed, the cache has {cache.num_blocks}")


@torch.inference_mode()
def perplexity(gen: Generator, ids: list[int], s: EvalSettings, on_start=None, on_step=None) -> dict:
    """`on_start(n)` hears the number of forward steps to come, `on_step()` each one done (progress)."""
    wins = windows(ids, s.window)[: s.max_windows]
    total, count = 0.0, 0
    if on_start is not None:
        on_start(-(-len(wins) // s.windows_per_step))
    for i in range(0, len(wins), s.windows_per_step):
        group = wins[i:i + s.windows_per_step]
        _runner_fits(gen, group)
        for w, logits in zip(group, _logits(gen, group)):
            target = torch.tensor(w[1:], device=logits.device)  # [n-1]
            total += F.cross_entropy(logits[:-1], target, reduction="sum").item()
            count += len(w) - 1
        if on_step is not None:
            on_step()
    return {"loss": total / count, "ppl": math.exp(total / count), "tokens_scored": count, "windows": len(wins)}


@torch.inference_mode()
def agreement(model: Generator, reference: Generator, prompts: list[list[int]], s: EvalSettings,
              on_start=None, on_step=None) -> dict:
    """KL, top-1 agreement (all positions of every prompt), greedy-sequence agreement. Progress: the
    groups of 8 prompts compared, then the two greedy generations."""
    kl_sum, agree, positions = 0.0, 0, 0
    step = 8
    if on_start is not None:
        on_start(-(-len(prompts) // step) + 2)
    for i in range(0, len(prompts), step):
        group = prompts[i:i + step]
        for got, ref in zip(_logits(model, group), _logits(reference, group)):
            logp, logq = F.log_softmax(ref, -1), F.log_softmax(got, -1)  # [n, V] reference, model
            kl_sum += (logp.exp() * (logp - logq)).sum().item()
            agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
            positions += ref.shape[0]
        if on_step is not None:
            on_step()
    params = SamplingParams(max_tokens=s.greedy_tokens, temperature=0.0, ignore_eos=True)
    ours = [c.token_ids for c in model.generate(prompts, params)]
    if on_step is not None:
        on_step()
    theirs = [c.token_ids for c in reference.generate(prompts, params)]
    if on_step is not None:
        on_step()
    prefixes = [_common_prefix(a, b) / max(1, len(b)) for a, b in zip(ours, theirs)]
    return {"kl": kl_sum / positions, "top1_agreement": agree / positions, "positions": positions,
            "greedy_match": sum(a == b for a, b in zip(ours, theirs)) / len(prompts),
            "greedy_prefix": sum(prefixes) / len(prompts), "prompts": len(prompts)}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def encode_prompts(gen: Generator, texts: list[str], s: EvalSettings) -> list[list[int]]:
    return [gen.encode(t)[: s.prompt_tokens] for t in texts[: s.num_prompts]]
