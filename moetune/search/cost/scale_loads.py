"""`--scale-routing loads:FILE`: per-layer expert loads of a real deployment, at the target model's
own expert count, for the scaled routing's sampler (search/cost/scale.py). Formats read:

- SGLang's expert-distribution recorder dump (`expert_distribution_recorder_<time>[_<rank>].pt`,
  written by `/dump_expert_distribution_record`, sglang/srt/eplb/expert_distribution.py), either mode:
  - stat (`--expert-distribution-recorder-mode stat`, `_StatAccumulator.dump`): a torch-saved dict
    whose `logical_count` is int [passes, layers, logical experts] (or [layers, experts]); summed
    over the passes;
  - per_token (`_DetailAccumulator.dump`, one file per rank): a dict whose `records` is a list of
    per-forward-pass dicts, each with `topk_ids_of_layer` int [layers, tokens, 8] (physical expert
    ids, -1 where a token picked fewer than 8), and `last_physical_to_logical_map` [layers,
    physical experts]; each pick is counted on its logical expert (physical → logical by that map;
    without it the ids are taken as logical), summed over the records: that rank's tokens' loads;
  rows are one per model layer (`num_hidden_layers`: a dense layer's rows are zero) or per MoE layer.
- a moetune run directory (`POST /v1/expert_distribution/dump` of `moetune serve`, or `moetune
  profile --out`): `expert_load.parquet` (step, kind, layer, expert, tokens), layer = the model's
  layer index, every expert listed; summed over the steps.

vLLM writes no expert-load file: its EPLB keeps the load window (`EplbState.expert_load_window`,
[window, MoE layers, physical experts]) in device memory and rebalances from it in place;
`EPLBConfig` (vllm/config/parallel.py, main at commit 00193b8) has no save or load option (the
proposals to write it, vllm PRs 26176 and 41141, were closed unmerged / are open). A `.safetensors`
file is therefore refused in one line naming the formats above.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moetune.errors import MoetuneError

PARQUET = "expert_load.parquet"


def read_target_loads(path: str | Path, moe_layers: list[int], num_experts: int, num_layers: int) -> np.ndarray:
    """[Lm, E] token copies per (MoE layer, expert) of the dump at `path`, checked against the target
    (its MoE layer ids, E experts, num_layers model layers): a mismatch is one line."""
    path = Path(path)
    if path.is_dir():
        loads, what = run_dir_loads(path, moe_layers), f"run directory {path}"
    elif path.is_file():
        loads, what = sglang_loads(path, moe_layers, num_experts, num_layers), f"{path}"
    else:
        raise MoetuneError(f"--scale-routing loads:{path}: no such file or run directory")
    if loads.shape != (len(moe_layers), num_experts):
        raise MoetuneError(f"--scale-routing loads:{path}: {what} holds {loads.shape[0]} layers × {loads.shape[1]} "
                           f"experts; the target model has {len(moe_layers)} MoE layers (of {num_layers} layers) × "
                           f"{num_experts} experts")
    if not np.isfinite(loads).all() or (loads < 0).any() or loads.sum() <= 0:
        raise MoetuneError(f"--scale-routing loads:{path}: the loads are empty, negative or not finite")
    return loads


def sglang_loads(path: Path, moe_layers: list[int], num_experts: int, num_layers: int) -> np.ndarray:
    """[Lm, E] of an SGLang recorder dump, stat or per_token mode (module doc); rows of every model
    layer → the MoE layers'."""
    if path.suffix == ".safetensors":
        raise MoetuneError(f"--scale-routing loads:{path}: vLLM writes no expert-load file (its EPLB load window "
                           "stays in device memory); give SGLang's expert-distribution recorder dump (.pt) or a "
                           "moetune run directory")
    data = torch_load(path)
    if isinstance(data, dict) and "logical_count" in data:
        count = stat_counts(path, data["logical_count"])
    elif isinstance(data, dict) and isinstance(data.get("records"), list):
        count = per_token_counts(path, data["records"], data.get("last_physical_to_logical_map"), num_experts)
    else:
        raise MoetuneError(f"--scale-routing loads:{path}: neither logical_count (stat mode) nor records "
                           "(per_token mode): not an SGLang expert-distribution recorder dump")
    if count.shape[0] == num_layers and num_layers != len(moe_layers):
        count = count[np.asarray(moe_layers)]  # one row per model layer: keep the MoE layers'
    return count


def torch_load(path: Path):
    """The torch-saved object at `path` (tensors and plain containers only), or one line."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, or one that needs arbitrary code to load
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise MoetuneError(f"--scale-routing loads:{path}: not a torch-saved SGLang expert-distribution dump "
                           f"({first})") from None


def stat_counts(path: Path, logical_count) -> np.ndarray:
    """[L, E] of stat mode's logical_count [passes, L, E] (or [L, E])."""
    import torch

    count = np.asarray(torch.as_tensor(logical_count).to(torch.float64).numpy())
    if count.ndim == 3:
        count = count.sum(axis=0)  # [passes, L, E] → [L, E]
    if count.ndim != 2:
        raise MoetuneError(f"--scale-routing loads:{path}: logical_count has shape {list(count.shape)}, "
                           "not [passes, layers, experts]")
    return count


def per_token_counts(path: Path, records: list, phys_to_log, num_experts: int) -> np.ndarray:
    """[L, E] of per_token mode: every record's top-k ids [L, T, 8] counted per (layer, logical expert); at
    least num_experts columns (an expert nobody picked is a zero column)."""
    import torch

    ids = []
    for rec in records:
        topk = rec.get("topk_ids_of_layer") if isinstance(rec, dict) else None
        if topk is None or torch.as_tensor(topk).ndim != 3:
            raise MoetuneError(f"--scale-routing loads:{path}: a per_token record without topk_ids_of_layer "
                               "[layers, tokens, k]")
        ids.append(torch.as_tensor(topk).long().numpy())  # [L, T, k]
    if not ids or len({a.shape[0] for a in ids}) != 1:
        raise MoetuneError(f"--scale-routing loads:{path}: per_token records are empty or disagree on the layers")
    ids_all = np.concatenate([a.reshape(a.shape[0], -1) for a in ids], axis=1)  # [L, T·k], -1 = no pick
    L = ids_all.shape[0]
    if phys_to_log is not None:
        p2l = np.asarray(torch.as_tensor(phys_to_log).long().numpy()).reshape(L, -1)  # [L, physical]
        if ids_all.max(initial=-1) >= p2l.shape[1]:
            raise MoetuneError(f"--scale-routing loads:{path}: a top-k id is past last_physical_to_logical_map's "
                               f"{p2l.shape[1]} physical experts")
        ids_all = np.where(ids_all >= 0, np.take_along_axis(p2l, np.maximum(ids_all, 0), axis=1), -1)
        E = int(p2l.max()) + 1
    else:
        E = int(ids_all.max(initial=-1)) + 1
    count = np.zeros((L, max(E, num_experts)))
    rows, cols = np.nonzero(ids_all >= 0)
    np.add.at(count, (rows, ids_all[rows, cols]), 1.0)
    return count


def run_dir_loads(path: Path, moe_layers: list[int]) -> np.ndarray:
    """[Lm, E] of a moetune run directory's expert_load.parquet (module doc)."""
    import pandas as pd

    try:
        df = pd.read_parquet(path / PARQUET, columns=["layer", "expert", "tokens"])
    except Exception as exc:  # missing file, not Parquet, missing columns: all one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise MoetuneError(f"--scale-routing loads:{path}: cannot read {PARQUET} ({first})") from None
    sums = df.groupby(["layer", "expert"])["tokens"].sum()
    layers = sorted({int(v) for v in df["layer"]})
    E = int(df["expert"].max()) + 1 if len(df) else 0
    if layers != sorted(moe_layers):
        raise MoetuneError(f"--scale-routing loads:{path}: run directory {path} holds {len(layers)} MoE layers "
                           f"(ids {layers[0] if layers else '-'}..{layers[-1] if layers else '-'}) × {E} experts; the "
                           f"target model has {len(moe_layers)} MoE layers (ids {moe_layers[0]}..{moe_layers[-1]})")
    loads = np.zeros((len(moe_layers), E))
    row = {layer: j for j, layer in enumerate(moe_layers)}
    for (layer, expert), tokens in sums.items():
        loads[row[int(layer)], int(expert)] = tokens
    return loads
