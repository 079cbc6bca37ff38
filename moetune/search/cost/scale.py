"""`--scale-model CONFIG.json`: replay a small model's routing on a larger architecture.

Three ways to carry the recorded routing over (`--scale-routing`, search/cost/scale.py; every one
keeps the trace's rows, so the steps and tokens the simulator reads are the run's own):

`stats` (the default) — per target MoE layer j, read source layer s = j·Lm_src // Lm_tgt:
- popularity: the source layer's sorted relative-load curve (load / mean load over experts, the
  whole trace) read as a quantile function at E_tgt points, then stretched about its mean so that
  its **coefficient of variation** (std / mean of the per-expert load) equals the source layer's —
  the statistic preserved (`load_cv`; the tests hold it within 10 %); a curve no target can carry
  (an expert's share above 1 / K_tgt: it would be picked twice by one token) is capped and the rest
  rescaled, and then the CV is the nearest reachable;
- placement of hot experts: the curve's values go to a random permutation of the expert ids (a
  fixed seed per layer), so hot experts are scattered, not contiguous blocks;
- picks: each token takes K_tgt distinct experts by systematic sampling (exact inclusion
  probabilities K_tgt · share over the trace) along a random order of the experts (another fixed
  permutation), at an offset u ∈ [0, 1) that is the token's rank among all tokens by its source
  picks (top-1 first, then top-2, ties broken by a fixed seed): tokens that chose the same source
  experts sit next to each other in u and so share most of their target picks, tokens that share
  only the top-1 share some, and u's spread over the trace is uniform (so loads are as exact as
  N tokens allow). Artefact: experts in the same unit of the cumulative order never co-occur.

`loads:FILE` — the same sampler, the popularity read from a real deployment's per-layer loads at
the target's expert count (search/cost/scale_loads.py: SGLang's expert-distribution recorder
dump, a moetune serve/profile run directory); the expert ids are the file's.

`balanced` — every expert of every layer equally loaded (share 1 / E_tgt), the same sampler: a
uniform routing, as the peer tools price it (benchmarks/bench_cluster_cases.py's comparison with
AIConfigurator's `balanced` tables); it measures what the trace's imbalance costs, not a real routing.

`blocks` (the old mapping, for comparison) — each source expert e becomes a group of
m = ceil(E_tgt / E_src) target experts e·m .. e·m + m − 1 (mod E_tgt); a token's k-th target expert
is in the group of its (k mod K_src)-th source expert, at an offset drawn once per (token, layer)
from a fixed seed, plus k // K_src so that a token never picks one expert twice (fewer target
experts: e → e·E_tgt // E_src; a repeat moves to the next id). A hot source expert makes a hot
contiguous group, so rank imbalance under contiguous placement is the toy model's (with E_tgt a
multiple of E_src · R / E_src ranks: exactly the toy's at the same R).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moetune.errors import MoetuneError

ROUTINGS = ("stats", "blocks", "balanced", "loads:FILE")
FLOOR = 1e-3  # the least relative load a target expert keeps (a cold expert is still routed to, rarely)


@dataclass(frozen=True)
class ScaleRouting:
    kind: str  # "stats" | "blocks" | "balanced" | "loads"
    path: str | None = None  # loads: the dump file or run directory

    def label(self) -> str:
        return f"loads:{self.path}" if self.kind == "loads" else self.kind


def parse_scale_routing(text: str | None) -> ScaleRouting:
    """`--scale-routing` → ScaleRouting (None: stats)."""
    if text is None or text == "stats":
        return ScaleRouting("stats")
    if text in ("blocks", "balanced"):
        return ScaleRouting(text)
    if text.startswith("loads:") and len(text) > len("loads:"):
        return ScaleRouting("loads", text[len("loads:"):])
    raise MoetuneError(f"--scale-routing {text!r} is not one of {', '.join(ROUTINGS)}")


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


def stored_format(path: str | Path) -> str:
    """The weights' own format a config.json says: fp8 when its `quantization_config` is
    `quant_method: fp8` (DeepSeek-V3's block-wise e4m3 checkpoint), else none (the model dtype)."""
    path = Path(path)
    cfg = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    q = cfg.get("quantization_config") or {}
    return "fp8" if isinstance(q, dict) and str(q.get("quant_method", "")).lower() == "fp8" else "none"


def scale_routing_ids(ids: np.ndarray, E_src: int, spec, routing: ScaleRouting, seed: int = 0) -> np.ndarray:
    """ids [N, Lm_src, K_src] → [N, Lm_tgt, K_tgt] (uint16) for the target ModelSpec, by `routing`."""
    E_tgt, Lm_tgt, K_tgt = spec.moe.num_experts, len(spec.moe_layers), spec.moe.router.top_k
    if routing.kind == "blocks":
        return scale_ids(ids, E_src, E_tgt, Lm_tgt, K_tgt, seed)
    if routing.kind == "balanced":
        return sample_ids(ids, E_src, np.full((Lm_tgt, E_tgt), 1.0 / E_tgt), K_tgt, seed)
    if routing.kind == "loads":
        from moetune.search.cost.scale_loads import read_target_loads

        loads = read_target_loads(routing.path, list(spec.moe_layers), E_tgt, spec.num_layers)  # [Lm_tgt, E_tgt]
        return sample_ids(ids, E_src, share_from_loads(loads, K_tgt), K_tgt, seed)
    return stats_ids(ids, E_src, E_tgt, Lm_tgt, K_tgt, seed)


# ---- stats ----------------------------------------------------------------------------------------

def relative_loads(ids_layer: np.ndarray, E: int) -> np.ndarray:
    """[E] copies per expert / mean copies per expert (mean 1) of one layer's picks ids_layer [N, K]."""
    counts = np.bincount(ids_layer.astype(np.int64).reshape(-1), minlength=E).astype(np.float64)
    return counts / max(counts.mean(), 1e-12)


def load_cv(loads: np.ndarray) -> np.ndarray:
    """Coefficient of variation (std / mean over experts) of each layer of loads [..., E] → [...]."""
    loads = np.asarray(loads, dtype=np.float64)
    return loads.std(axis=-1) / np.maximum(loads.mean(axis=-1), 1e-12)


def stats_ids(ids: np.ndarray, E_src: int, E_tgt: int, Lm_tgt: int, K_tgt: int, seed: int = 0) -> np.ndarray:
    """ids [N, Lm_src, K_src] → [N, Lm_tgt, K_tgt]: popularity of the source layer's CV (module doc)."""
    Lm_src = ids.shape[1]
    src_layer = (np.arange(Lm_tgt) * Lm_src) // Lm_tgt  # [Lm_tgt]
    rng = np.random.default_rng(seed)
    curves = [target_curve(relative_loads(ids[:, s], E_src), E_tgt, K_tgt) for s in src_layer]  # sorted, mean 1
    share = np.zeros((Lm_tgt, E_tgt))
    for j, curve in enumerate(curves):
        share[j, rng.permutation(E_tgt)] = curve / curve.sum()  # hot experts at random ids
    return sample_ids(ids, E_src, share, K_tgt, seed + 1)


def target_curve(rel_src: np.ndarray, E_tgt: int, K_tgt: int) -> np.ndarray:
    """[E_tgt] relative loads (descending, mean 1, each ≤ E_tgt / K_tgt) with the CV of rel_src [E_src]."""
    E_src = len(rel_src)
    sorted_src = np.sort(rel_src)[::-1]
    at = np.minimum(((np.arange(E_tgt) + 0.5) * E_src / E_tgt).astype(np.int64), E_src - 1)
    base = sorted_src[at] / max(sorted_src[at].mean(), 1e-12)  # the quantile function at E_tgt points
    goal = float(load_cv(rel_src))
    if goal == 0.0 or float(load_cv(base)) == 0.0:
        return np.ones(E_tgt)
    shaped = lambda c: cap_relative(np.maximum(1.0 + c * (base - 1.0), FLOOR), E_tgt / K_tgt)  # noqa: E731
    lo, hi = 0.0, 1.0
    while float(load_cv(shaped(hi))) < goal and hi < 1e3:  # CV grows with the stretch c (until the caps)
        lo, hi = hi, 2.0 * hi
    for _ in range(50):  # bisection on c
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(load_cv(shaped(mid))) < goal else (lo, mid)
    return shaped(hi)


def cap_relative(rel: np.ndarray, cap: float) -> np.ndarray:
    """rel [E] rescaled to mean 1 with no value above cap (capped values fixed, the rest rescaled)."""
    rel = rel / rel.mean()
    E = len(rel)
    fixed = np.zeros(E, dtype=bool)
    for _ in range(E):
        over = (rel > cap + 1e-12) & ~fixed
        if not over.any():
            break
        fixed |= over
        free = E - cap * fixed.sum()  # the total the uncapped experts share
        rel = np.where(fixed, cap, rel * free / max(rel[~fixed].sum(), 1e-12))
    return rel


def share_from_loads(loads: np.ndarray, K: int) -> np.ndarray:
    """[Lm, E] share of each layer's copies (rows sum to 1, none above 1 / K; an empty layer: even)."""
    loads = np.asarray(loads, dtype=np.float64)
    E = loads.shape[1]
    rows = [cap_relative(np.maximum(r / r.mean(), FLOOR), E / K) / E if r.sum() > 0 else np.full(E, 1.0 / E)
            for r in loads]
    return np.stack(rows)


# ---- the sampler ----------------------------------------------------------------------------------

def token_offsets(src: np.ndarray, E_src: int, seed: int) -> np.ndarray:
    """[N] u ∈ (0, 1) of each token: its rank by (top-1, top-2) source pick, ties in a seeded order."""
    N = len(src)
    code = src[:, 0].astype(np.int64) * E_src + (src[:, 1].astype(np.int64) if src.shape[1] > 1 else 0)
    jitter = np.random.default_rng(seed).random(N)
    order = np.lexsort((jitter, code))  # [N] tokens by code, then jitter
    u = np.empty(N)
    u[order] = (np.arange(N) + 0.5) / N
    return u


def systematic_picks(share: np.ndarray, order: np.ndarray, u: np.ndarray, K: int) -> np.ndarray:
    """[N, K] distinct experts per token: systematic sampling of inclusion K · share [E] (each ≤ 1)
    along `order` [E] at offsets u [N] (expert at cumulative positions u, u + 1, ..., u + K − 1)."""
    pi = share[order] * K
    cum = np.cumsum(pi)
    cum *= K / cum[-1]
    at = u[:, None] + np.arange(K)[None, :]  # [N, K]
    idx = np.minimum(np.searchsorted(cum, at, side="right"), len(order) - 1)
    return order[idx]


def sample_ids(ids: np.ndarray, E_src: int, share: np.ndarray, K_tgt: int, seed: int = 0) -> np.ndarray:
    """ids [N, Lm_src, K_src] → [N, Lm_tgt, K_tgt] drawn from share [Lm_tgt, E_tgt] (module doc)."""
    N, Lm_src, _ = ids.shape
    Lm_tgt, E_tgt = share.shape
    src_layer = (np.arange(Lm_tgt) * Lm_src) // Lm_tgt  # [Lm_tgt]
    rng = np.random.default_rng(seed)
    out = np.empty((N, Lm_tgt, K_tgt), dtype=np.uint16)
    offsets = {s: token_offsets(ids[:, s], E_src, seed + 7 + int(s)) for s in set(src_layer.tolist())}
    for j in range(Lm_tgt):
        order = rng.permutation(E_tgt)  # the sampling order: independent of the ids (and of placement)
        out[:, j] = systematic_picks(share[j], order, offsets[int(src_layer[j])], K_tgt)
    return out


# ---- blocks (the old mapping) ---------------------------------------------------------------------

def scale_ids(ids: np.ndarray, E_src: int, E_tgt: int, Lm_tgt: int, K_tgt: int, seed: int = 0) -> np.ndarray:
    """ids [N, Lm_src, K_src] → [N, Lm_tgt, K_tgt] (uint16): the block mapping (module doc)."""
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


# ---- what a placement makes of the loads ----------------------------------------------------------

def rank_imbalance(loads: np.ndarray, ranks: int, policy: str) -> float:
    """Mean over layers of max / mean copies per rank of loads [Lm, E] (the whole trace at once)
    under placement `policy` (contiguous | round_robin | eplb: placed from these loads)."""
    from moetune.moe.placement import make_placement

    Lm, E = loads.shape
    p = make_placement(policy, E, ranks, list(range(Lm)), 0, loads if policy == "eplb" else None)
    P = p.phy2log.shape[1]
    reps = np.stack([np.bincount(row, minlength=E) for row in p.phy2log])  # [Lm, E] slots per expert
    per_slot = np.take_along_axis(loads, p.phy2log, axis=1) / np.take_along_axis(reps, p.phy2log, axis=1)
    per_rank = per_slot.reshape(Lm, ranks, P // ranks).sum(axis=2)  # [Lm, R] (slot i on rank i // (P / R))
    return float(np.mean(per_rank.max(axis=1) / np.maximum(per_rank.mean(axis=1), 1e-12)))
