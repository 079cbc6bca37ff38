"""`--scale-model CONFIG.json`: replay a small model's routing on a larger architecture.

How the recorded ids are carried over (per token, per target layer):
- layers: target MoE layer j reads source MoE layer j·Lm_src // Lm_tgt (the depth profile of
  skew is stretched over the deeper model);
- experts (more target experts): each source expert e becomes a group of m = ceil(E_tgt / E_src) target experts
  e·m .. e·m + m − 1 (mod E_tgt); a token's k-th target expert is in the group of its
  (k mod K_src)-th source expert, at an offset drawn once per (token, layer) from a fixed seed,
  plus k // K_src so that a token never picks one expert twice.
- experts (fewer target experts): source expert e becomes e·E_tgt // E_src (neighbours merge);
- a pick that repeats an earlier pick of the same token moves to the next expert id.
So each layer's load distribution carries over at group granularity (a hot source expert makes a
hot group), and so does co-selection (tokens that chose the same source experts choose the same
groups); within a group the load splits evenly in expectation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moetune.errors import MoetuneError


def read_scale_spec(path: str | Path):
    """A Hugging Face config.json (any model type moetune reads) → ModelSpec."""
    from moetune.model.adapters import spec_from_config

    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise MoetuneError(f"--scale-model '{path}' does not exist (give a config.json)")
    try:
        cfg = json.loads(path.read_text())
        return spec_from_config(cfg)
    except json.JSONDecodeError as exc:
        raise MoetuneError(f"--scale-model '{path}' is not JSON ({exc.msg})") from None


def scale_ids(ids: np.ndarray, E_src: int, E_tgt: int, Lm_tgt: int, K_tgt: int, seed: int = 0) -> np.ndarray:
    """ids [N, Lm_src, K_src] → [N, Lm_tgt, K_tgt] (uint16)."""
    N, Lm_src, K_src = ids.shape
    m = max(1, -(-E_tgt // E_src))
    fold = E_tgt < E_src  # fewer target experts: source experts merge, e → e·E_tgt // E_src
    src_layer = (np.arange(Lm_tgt) * Lm_src) // Lm_tgt  # [Lm_tgt]
    offset = np.random.default_rng(seed).integers(0, m, size=(N, Lm_tgt))  # [N, Lm_tgt]
    out = np.empty((N, Lm_tgt, K_tgt), dtype=np.int64)
    for k in range(K_tgt):
        base = ids[:, src_layer, k % K_src].astype(np.int64)  # [N, Lm_tgt]
        col = base * E_tgt // E_src if fold else (base * m + (offset + k // K_src) % m) % E_tgt
        for _ in range(K_tgt):  # a token never picks one expert twice: step past earlier picks
            clash = (out[:, :, :k] == col[:, :, None]).any(axis=2)
            if not clash.any():
                break
            col = np.where(clash, (col + 1) % E_tgt, col)
        out[:, :, k] = col
    return out.astype(np.uint16)
