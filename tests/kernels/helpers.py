"""Routing fixtures shared by the kernel tests (tiny shapes: the interpreter is slow)."""

from __future__ import annotations

import torch


def random_topk_ids(T: int, E: int, K: int, seed: int = 0, avoid: int | None = None) -> torch.Tensor:
    """[T, K] distinct experts per token; `avoid` is never chosen (an empty expert)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor([e for e in range(E) if e != avoid])
    rows = [pool[torch.randperm(len(pool), generator=g)[:K]] for _ in range(T)]
    return torch.stack(rows) if rows else torch.empty(0, K, dtype=torch.long)


def all_to_one(T: int, E: int, K: int, hot: int = 3) -> torch.Tensor:
    """Every token picks `hot` first, then K-1 others: one expert gets all T copies."""
    others = [e for e in range(E) if e != hot]
    return torch.tensor([[hot] + others[(t % (E - K + 1)):(t % (E - K + 1)) + K - 1] for t in range(T)])
