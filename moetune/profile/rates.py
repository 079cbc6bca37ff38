"""Achieved GFLOP/s and GB/s per phase: work counted from the recorded shapes / measured time.

b_w = weight dtype bytes, b_a = activation dtype bytes, rows = T·K token copies, active = experts
with at least one row. Bytes are weights touched + activations read and written (a lower bound:
caches and re-reads are not counted). Sums run over every step of a kind and every layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

FORMULAS = {
    "router": ("2·T·D·E", "E·D·b_w + T·D·b_a + 4·T·E"),
    "permute": ("0", "2·rows·D·b_a"),
    "experts": ("2·3·rows·D·I", "active·3·D·I·b_w + 2·rows·D·b_a"),
    "shared_expert": ("2·3·T·D·I_s", "3·D·I_s·b_w + 2·T·D·b_a"),
    "unpermute": ("2·rows·D", "rows·D·b_a + T·D·b_a"),
    "attention": ("2·T·D·(2·H·Dh + 2·Hkv·Dh) + 4·pairs·H·Dh", "D·(2·H·Dh + 2·Hkv·Dh)·b_w + 2·ctx·Hkv·Dh·b_a + 2·T·D·b_a"),
    "dense_mlp": ("2·3·T·D·I_d", "3·D·I_d·b_w + 2·T·D·b_a"),
}


@dataclass(frozen=True)
class ModelDims:
    D: int
    E: int
    K: int
    I: int
    I_shared: int
    dense_I: dict  # layer → intermediate size of dense MLP layers
    moe_layers: list
    num_layers: int
    gqa: dict | None  # {"H", "Hkv", "Dh"} for GQA attention, None for MLA (not counted)
    b_w: int
    b_a: int

    def as_dict(self) -> dict:
        return asdict(self)


def model_dims(model) -> ModelDims:
    import torch

    from moetune.spec import GQASpec

    spec = model.spec
    att = spec.attention
    gqa = {"H": att.num_heads, "Hkv": att.num_kv_heads, "Dh": att.head_dim} if isinstance(att, GQASpec) else None
    b = torch.empty((), dtype=model.dtype).element_size()
    dense = {str(l.index): l.dense_intermediate for l in spec.layers if not l.is_moe}
    return ModelDims(spec.hidden_size, spec.moe.num_experts, spec.moe.router.top_k, spec.moe.intermediate_size,
                     spec.moe.shared_intermediate_size, dense, list(spec.moe_layers), spec.num_layers, gqa, b, b)


def phase_work(dims: dict, steps: pd.DataFrame, moe: pd.DataFrame, active: pd.DataFrame) -> pd.DataFrame:
    """Per (kind, phase): flops and bytes. `active`: step, layer, active (experts with rows)."""
    D, E, K, I, Is, bw, ba = (dims[k] for k in ("D", "E", "K", "I", "I_shared", "b_w", "b_a"))
    m = moe.merge(active, on=["step", "layer"], how="left").fillna({"active": 0})
    T, rows = m.tokens, m.rows
    parts = {
        "router": (2 * T * D * E, E * D * bw + T * D * ba + 4 * T * E),
        "permute": (0 * T, 2 * rows * D * ba),
        "experts": (6 * rows * D * I, m.active * 3 * D * I * bw + 2 * rows * D * ba),
        "unpermute": (2 * rows * D, rows * D * ba + T * D * ba),
    }
    if Is:
        parts["shared_expert"] = (6 * T * D * Is, 3 * D * Is * bw + 2 * T * D * ba)
    out = [_sum(m.kind, name, f, b) for name, (f, b) in parts.items()]
    out += _attention_work(dims, steps) + _dense_work(dims, steps)
    return pd.concat(out)[["kind", "phase", "flops", "bytes"]].groupby(["kind", "phase"], as_index=False).sum()


def _sum(kind: pd.Series, name: str, flops: pd.Series, nbytes: pd.Series) -> pd.DataFrame:
    df = pd.DataFrame({"kind": kind, "flops": flops.astype(float), "bytes": nbytes.astype(float)})
    return df.groupby("kind", as_index=False).sum().assign(phase=name)


def _attention_work(dims: dict, steps: pd.DataFrame) -> list[pd.DataFrame]:
    g = dims.get("gqa")
    if not g:
        return []
    D, bw, ba, L = dims["D"], dims["b_w"], dims["b_a"], dims["num_layers"]
    H, Hkv, Dh = g["H"], g["Hkv"], g["Dh"]
    proj = D * (2 * H * Dh + 2 * Hkv * Dh)
    T, pairs, ctx = steps.tokens, steps.attn_pairs, steps.context_tokens
    flops = L * (2 * T * proj + 4 * pairs * H * Dh)
    nbytes = L * (proj * bw + 2 * ctx * Hkv * Dh * ba + 2 * T * D * ba)
    return [_sum(steps.kind, "attention", flops, nbytes)]


def _dense_work(dims: dict, steps: pd.DataFrame) -> list[pd.DataFrame]:
    sizes = list(dims.get("dense_I", {}).values())
    if not sizes:
        return []
    D, bw, ba, T = dims["D"], dims["b_w"], dims["b_a"], steps.tokens
    flops = sum(6 * T * D * i for i in sizes)
    nbytes = sum(3 * D * i * bw + 2 * T * D * ba for i in sizes)
    return [_sum(steps.kind, "dense_mlp", flops, nbytes)]


def phase_rates(work: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """kind, phase, seconds, gflop, gbyte, gflops_per_s, gbytes_per_s, flop_formula, byte_formula."""
    secs = phases.groupby(["kind", "phase"], as_index=False).seconds.sum()
    df = work.merge(secs, on=["kind", "phase"], how="inner")
    df["gflop"], df["gbyte"] = df.flops / 1e9, df.bytes / 1e9
    df["gflops_per_s"] = df.gflop / df.seconds.where(df.seconds > 0)
    df["gbytes_per_s"] = df.gbyte / df.seconds.where(df.seconds > 0)
    df["flop_formula"] = df.phase.map(lambda p: FORMULAS[p][0])
    df["byte_formula"] = df.phase.map(lambda p: FORMULAS[p][1])
    return df.drop(columns=["flops", "bytes"])
