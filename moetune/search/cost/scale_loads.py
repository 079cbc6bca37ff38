"""`--scale-routing loads:FILE`: per-layer expert loads of a real deployment, at the target model's
own expert count, for the scaled routing's sampler (search/cost/scale.py). Two formats:

- SGLang's expert-distribution recorder dump in stat mode (`expert_distribution_recorder_<time>.pt`,
  written by `/dump_expert_distribution_record` with `--expert-distribution-recorder-mode stat`,
  sglang/srt/eplb/expert_distribution.py `_StatAccumulator.dump`): a torch-saved dict whose
  `logical_count` is int [passes, layers, logical experts] (or [layers, experts]), one row per
  model layer (`num_hidden_layers`: a dense layer's rows are zero) or per MoE layer; summed over
  the passes. Its per-token mode (`records`) is not read.
- a moetune run directory (`POST /v1/expert_distribution/dump` of `moetune serve`, or `moetune
  profile --out`): `expert_load.parquet` (step, kind, layer, expert, tokens), layer = the model's
  layer index, every expert listed; summed over the steps.
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
        loads, what = sglang_loads(path, moe_layers, num_layers), f"{path}"
    else:
        raise MoetuneError(f"--scale-routing loads:{path}: no such file or run directory")
    if loads.shape != (len(moe_layers), num_experts):
        raise MoetuneError(f"--scale-routing loads:{path}: {what} holds {loads.shape[0]} layers × {loads.shape[1]} "
                           f"experts; the target model has {len(moe_layers)} MoE layers (of {num_layers} layers) × "
                           f"{num_experts} experts")
    if not np.isfinite(loads).all() or (loads < 0).any() or loads.sum() <= 0:
        raise MoetuneError(f"--scale-routing loads:{path}: the loads are empty, negative or not finite")
    return loads


def sglang_loads(path: Path, moe_layers: list[int], num_layers: int) -> np.ndarray:
    """[Lm, E] of an SGLang stat-mode dump (module doc); rows of every model layer → the MoE layers'."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, or one that needs arbitrary code to load
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise MoetuneError(f"--scale-routing loads:{path}: not a torch-saved SGLang expert-distribution dump "
                           f"({first})") from None
    if not isinstance(data, dict) or "logical_count" not in data:
        kind = "a per_token dump (records)" if isinstance(data, dict) and "records" in data else "no logical_count"
        raise MoetuneError(f"--scale-routing loads:{path}: {kind}; dump SGLang's recorder in stat mode "
                           "(--expert-distribution-recorder-mode stat)")
    count = np.asarray(torch.as_tensor(data["logical_count"]).to(torch.float64).numpy())
    if count.ndim == 3:
        count = count.sum(axis=0)  # [passes, L, E] → [L, E]
    if count.ndim != 2:
        raise MoetuneError(f"--scale-routing loads:{path}: logical_count has shape {list(count.shape)}, "
                           "not [passes, layers, experts]")
    if count.shape[0] == num_layers and num_layers != len(moe_layers):
        count = count[np.asarray(moe_layers)]  # one row per model layer: keep the MoE layers'
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
