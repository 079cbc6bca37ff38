"""Evaluation: token-level perplexity, unigram baseline, per-layer routing load.

Perplexity protocol (used everywhere, including metrics.json): the token stream is cut into
non-overlapping windows of S tokens (the last, shorter window is kept if it has >= 2 tokens);
inside each window, token j >= 1 is predicted from tokens 0..j-1 of the same window (no cross-window
context, the first token of each window is never scored); ppl = exp(sum NLL / number scored).
"""
from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F


def stream(docs_ids: list[list[int]], eos_id: int) -> list[int]:
    """Concatenate documents, each followed by EOS (the training layout)."""
    out: list[int] = []
    for ids in docs_ids:
        out.extend(ids)
        out.append(eos_id)
    return out


def windows(ids: list[int], S: int) -> list[list[int]]:
    """Non-overlapping windows of S tokens; the tail is kept if it has >= 2 tokens."""
    out = [ids[i:i + S] for i in range(0, len(ids), S)]
    return [w for w in out if len(w) >= 2]


@torch.no_grad()
def nll_sum(model, wins: list[list[int]], batch: int = 8) -> tuple[float, int]:
    """(sum of NLL in nats, number of scored tokens) over windows, fp32 logits."""
    total, count = 0.0, 0
    for i in range(0, len(wins), batch):
        group = wins[i:i + batch]
        for w_len in sorted({len(w) for w in group}):
            x = torch.tensor([w for w in group if len(w) == w_len])  # [B, S]
            logits = model(input_ids=x, use_cache=False).logits.float()  # [B, S, V]
            lp = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                 x[:, 1:].reshape(-1), reduction="sum")
            total += lp.item()
            count += x[:, 1:].numel()
    return total, count


def perplexity(model, wins: list[list[int]], batch: int = 8) -> dict:
    total, count = nll_sum(model, wins, batch)
    return {"loss": total / count, "ppl": math.exp(total / count), "tokens_scored": count}


def scored_targets(wins: list[list[int]]) -> list[int]:
    """The tokens that the perplexity protocol scores (all but each window's first)."""
    return [t for w in wins for t in w[1:]]


def unigram_ppl(train_ids: list[int], targets: list[int], vocab_size: int) -> dict:
    """Unigram baseline: add-one smoothed train-split token frequencies over the whole vocab."""
    counts = Counter(train_ids)
    denom = len(train_ids) + vocab_size
    nll = -sum(math.log((counts.get(t, 0) + 1) / denom) for t in targets)
    return {"loss": nll / len(targets), "ppl": math.exp(nll / len(targets)),
            "tokens_scored": len(targets), "train_tokens": len(train_ids)}


@torch.no_grad()
def routing_load(model, wins: list[list[int]], top_k: int, n_experts: int, batch: int = 8) -> list[dict]:
    """Per layer: tokens per expert (top-k selections over all window tokens), max/mean, mean/max."""
    counts = None
    for i in range(0, len(wins), batch):
        group = wins[i:i + batch]
        for w_len in sorted({len(w) for w in group}):
            x = torch.tensor([w for w in group if len(w) == w_len])  # [B, S]
            out = model(input_ids=x, use_cache=False, output_router_logits=True)
            per_layer = [r.reshape(-1, n_experts) for r in out.router_logits]  # L x [B*S, E]
            if counts is None:
                counts = torch.zeros(len(per_layer), n_experts, dtype=torch.long)  # [L, E]
            for layer, logits in enumerate(per_layer):
                idx = logits.float().topk(top_k, dim=-1).indices  # [B*S, K]
                counts[layer] += torch.bincount(idx.reshape(-1), minlength=n_experts)
    return [load_stats(layer, c.tolist()) for layer, c in enumerate(counts)]


def load_stats(layer: int, counts: list[int]) -> dict:
    mean = sum(counts) / len(counts)
    mx = max(counts)
    return {"layer": layer, "tokens_per_expert": counts, "max": mx, "min": min(counts),
            "mean": mean, "imbalance": mx / mean, "balancedness": mean / mx}
