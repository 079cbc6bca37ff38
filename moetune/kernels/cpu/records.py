"""The arguments of the fused decode layer kernels (`_jit_layer`), as small typed records.

Each record holds what one module owns, and that module builds it (numpy views of its fp32 CPU
weights, made once per layer at load and kept by `model/fused_decode.py`; the step's records once
per step):

  Norm        RMSNorm weight [C] and eps                      `model.norm.kernel_norm`
  Projection  a Linear: w [N, K], row scales [N], bias [N]    `projection` (`model.linear.Linear.kernel_record`)
  Attention   a GQA layer's projections, heads, q/k norms,    `model.attention.GQAAttention.kernel_record`
              clip and softmax scale
  StepRows    the step's rotary rows and cache rows           `model/fused_decode.py` (the step's)
  KVPools     one layer's K and V pools                       `model.kv_cache.PagedKVCache.kernel_pools`
  DecodePlan  the step's block tables, lengths, scratch       `kernels.cpu.attention.decode_plan`
  Router      the gate as a Projection, the top-k settings    `routing.router_record` (`MoELayer.kernel_router`)
  Experts     one layer's expert weights, scales, row limit   `experts.experts_record` (`CPUBackend.kernel_experts`)
  Tuning      threads, the serial rule, the experts' tiling,  `experts.tuning`
              the int8 and int4 integer paths' row limits

The kernels take each record as a plain tuple (`plain`, made where the record is kept: once per
layer, or once per step) and unpack it in its fields' order: numba types a named-tuple argument
~0.4 µs slower than a plain tuple of the same fields (measured here: 0.54 against 0.17 µs for one
field, 1.12 against 0.61 for eight), and a layer's two calls pass 16 of them. A call types each
record by its fields' types, so these must not vary between layers: floats are Python floats, ints
Python ints, "none" an empty fp32 array. Importing this module imports numpy and torch only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from moetune.kernels.cpu.arrays import numpy_view, ones
from moetune.kernels.cpu.q4r import interleaved, repacked
from moetune.kernels.quant_formats import PackedWeight, WeightFormat

QK_NONE, QK_PER_HEAD, QK_FULL = 0, 1, 2  # Attention.qk_kind
QK_KINDS = {"none": QK_NONE, "per_head": QK_PER_HEAD, "full": QK_FULL}  # GQASpec.qk_norm → qk_kind
EMPTY = np.empty(0, np.float32)  # "no bias" / "no norm weight" (read-only by convention)


class Norm(NamedTuple):
    """An RMSNorm: x · rsqrt(mean(x²) + eps) · w."""
    w: np.ndarray  # [C] fp32 (EMPTY: no norm)
    eps: float


class Projection(NamedTuple):
    """x [T, K] @ w [N, K].T · scale (+ bias): a Linear as the decode kernel takes it."""
    w: np.ndarray  # [N, K] fp32, or int8 rows; int4: [N, G, group/2] uint8 (two nibbles a byte)
    scale: np.ndarray  # [N] per-row scales (ones for fp32); int4: [N, G] per group
    bias: np.ndarray  # [N], or EMPTY


class Attention(NamedTuple):
    """A grouped-query attention layer: qkv = x·Wqkv (+b) → q/k norms, clip → rotary → paged
    attention → ·Wo (+b)."""
    qkv: Projection  # [(H + 2Hkv)·Dh, D]
    o: Projection  # [D, H·Dh]
    heads: int  # H
    kv_heads: int  # Hkv
    head_dim: int  # Dh
    qk_kind: int  # QK_NONE | QK_PER_HEAD | QK_FULL
    q_norm: Norm  # [Dh] per head, [H·Dh] full, EMPTY none
    k_norm: Norm
    clip: float  # ≤ 0: no clip
    scale: float  # softmax scale


class StepRows(NamedTuple):
    """What a decode step's T tokens share over all layers."""
    cos: np.ndarray  # [T, Dh] fp32
    sin: np.ndarray  # [T, Dh] fp32
    rows: np.ndarray  # [T] int64 cache row of each token


class KVPools(NamedTuple):
    """One layer's paged cache."""
    k: np.ndarray  # [rows, Hkv, Dh] fp32
    v: np.ndarray  # [rows, Hkv, Dh] fp32


class Router(NamedTuple):
    """logits = x·Wg → the K best scores (softmax or sigmoid, + bias to pick) → renormalise → scale."""
    gate: Projection  # [E, D], no bias
    bias: np.ndarray  # [E] selection bias (unread unless use_bias)
    use_bias: bool
    sigmoid: bool
    top_k: int
    renormalize: bool
    scaling: float


class Experts(NamedTuple):
    """One layer's routed experts in one fp32, int8 or int4 format, over num_slots physical slots."""
    w13: np.ndarray  # [P, 2I, D] fp32 | int8; int4: [P, 2I, Gd, group/2] uint8
    s13: np.ndarray  # [P, 2I] fp32 row scales (ones for fp32); int4: [P, 2I, Gd] group scales
    w2: np.ndarray  # [P, D, I]; int4: [P, D, Gi, group/2]
    s2: np.ndarray  # [P, D]; int4: [P, D, Gi]
    nbytes: int  # weight bytes of all P slots (`formats.weight_bytes`: `launch`'s rule)
    num_slots: int  # P
    row_limit: int  # rows of one slot up to which the kernel computes it (`CPUBackend.row_limit`)


class Tuning(NamedTuple):
    """How the kernels of one step run."""
    threads: int  # numba threads (1: the serial twins)
    serial_bytes: int  # calls reading fewer bytes than this run on one thread (`runtime.SERIAL_BYTES`)
    block13: int  # the experts' work items (`experts.BLOCK_13`, `BLOCK_2`, `SCHEDULES`)
    block2: int
    schedule: int
    q8: int  # int8 projections against up to this many x rows (experts: one) in integers (0: never;
    # `runtime.INT8_ROW`, `runtime.Q8_ROWS`)
    q4: int  # int4 projections and experts against up to this many x rows in integers (`runtime.Q4_ROWS`)
    q4x_few: int  # int8 parts of x on the interleaved int4 kernels: calls (experts) of ≤ 16 rows,
    q4x: int  # and beyond (`runtime.Q4_X_PARTS_FEW`, `Q4_X_PARTS`)


def plain(record: tuple) -> tuple:
    """A record (and the records inside it) as the plain tuple the kernels take."""
    return tuple(plain(f) if isinstance(f, tuple) else f for f in record)


def projection(weight, bias=None) -> Projection:
    """A projection's record from weight [N, K] (fp32, or a PackedWeight: int8 with a scale per row,
    int4 with one per group) and bias [N], CPU tensors (views, not copies when contiguous)."""
    b = EMPTY if bias is None else numpy_view(bias)
    if isinstance(weight, PackedWeight) and weight.fmt == WeightFormat.INT4 and interleaved(weight):
        data, scale = repacked(weight)  # [N, G, H] interleaved, [S·N/16, G, 16] (`q4r.Scales`)
        return Projection(numpy_view(data), numpy_view(scale), b)
    if isinstance(weight, PackedWeight) and weight.fmt == WeightFormat.INT4:
        N = weight.data.shape[0]
        data = weight.data.contiguous().view(N, -1, weight.group_size // 2)  # [N, G, group/2]
        return Projection(numpy_view(data), numpy_view(weight.scale.float()), b)
    if isinstance(weight, PackedWeight):
        return Projection(numpy_view(weight.data), numpy_view(weight.scale.float()), b)
    return Projection(numpy_view(weight), ones(weight.shape[0]).numpy(), b)


def norm(weight=None, eps: float = 0.0) -> Norm:
    """An RMSNorm's record (weight None: the empty norm of a layer without one)."""
    return Norm(EMPTY if weight is None else numpy_view(weight), float(eps))
