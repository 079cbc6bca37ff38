"""A decode step's decoder layers in two CPU kernel calls each (fp32 models under the `cpu` backend).

Unfused, a decode layer is ~14 Python-level calls: two norms, three projections, rotary, the KV
write, attention, two adds, the router GEMM, top-k, permute, experts and unpermute. Each costs a few
µs of Python and torch dispatch, and runs right after a kernel streamed megabytes of weights through
the caches, where each costs tens of µs: about a quarter of a 340M-style decode step at batch 1
(docs/cpu.md). Fused, a layer is

  attention_block (numba)   norm → QKV (+b) → [q/k norm, clip] → rotary → K, V into the cache
                            → paged attention → o (+b) → h += ... → norm → router GEMM → top-k
  ExpertStore.acquire, prefetch, shared expert   (Python: the seams stay where they were)
  moe_block (numba)         permute → experts → unpermute (+ shared) → h += ...

with the same kernels in the same order as the unfused layer (`kernels/cpu/_jit_layer.py`), so the
outputs agree to rounding (tests compare them). A step is fused when no probe that times phases is
attached (the profiler times the unfused layer's phases; serve's live expert-load window only
counts routing and hears it from here), every sequence decodes one token and there are at most
FUSED_ROWS of them; a layer, when it is grouped-query attention and an MoE block the kernels take:
`cpu` backend, one rank, no capacity limit, routing without group limits. Its experts run fused
when the store hands out one fp32 or int8 format and no slot has more rows than the backend's
`row_limit`; otherwise the unfused phases take over after the router. Layers not fused (dense MLP,
MLA) run unfused within the same step. Measured (in-process A/B, unfused ÷ fused step time,
docs/cpu.md): 1.15-1.21x at batch 1, 1.06-1.08x at 16 and 1.09-1.11x at 32-64 on 340M/Qwen3-style
models; 1.20-1.74x on the bundled model, whose layers are mostly overhead; the projections at 17-64
rows run the decode kernel here even where torch's GEMM computes faster (small weights), and the
step still gains.

A step used to run every layer in one call when the layers were alike and the store resident; an
in-process A/B measured it at 1.00-1.04x over layer by layer (0.999-1.049 median on 2026-12-01, load
12-14: benchmarks/ab_fused_whole_step.py at 8e60362), under the 5 % that would pay for a third path,
so every fused step runs layer by layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from moetune.kernels.cpu.experts import BLOCK_13, BLOCK_2, SCHEDULE, SCHEDULES
from moetune.kernels.cpu.formats import weight_bytes
from moetune.kernels.cpu.routing import takes_routing
from moetune.kernels.cpu import runtime
from moetune.kernels.cpu.runtime import SERIAL_BYTES, current_threads, jit_layer, ones
from moetune.kernels.quant_formats import PackedWeight, WeightFormat
from moetune.model.attention import GQAAttention
from moetune.model.batch import StepBatch, StepKind
from moetune.model.kv_cache import PagedKVCache
from moetune.model.linear import weight_tensors
from moetune.moe.cpu_backend import CPUBackend, kernel_takes
from moetune.moe.dispatch import LocalDispatcher
from moetune.moe.layer import MoELayer
from moetune.moe.router import RouterOutput

FUSED_ROWS = 64  # decode steps of up to this many sequences are fused (see the module docstring)
QK_KINDS = {"none": 0, "per_head": 1, "full": 2}  # _jit_layer.QK_*
_EMPTY = np.empty(0, np.float32)  # "no bias" / "no norm weight"


@dataclass(frozen=True)
class _Dense:
    """One layer's weights outside the expert store, as numpy views (made on the layer's first
    fused step; `ptr` notices a weight moved since)."""
    ptr: int
    norm1: np.ndarray
    norm2: np.ndarray
    eps: float
    wqkv: np.ndarray  # fp32 or int8 rows
    ones_qkv: np.ndarray  # their scale per row (ones for fp32)
    bqkv: np.ndarray
    wo: np.ndarray
    ones_o: np.ndarray
    bo: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    qk_eps: float
    wg: np.ndarray
    ones_g: np.ndarray
    bias: np.ndarray


@dataclass(frozen=True)
class _Experts:
    """The arrays of the ExpertWeights `weights` (kept, so that the next acquire can be compared)."""
    weights: object
    w13: np.ndarray
    s13: np.ndarray
    w2: np.ndarray
    s2: np.ndarray
    nbytes: int
    slots: int
    row_limit: int  # rows of one slot up to which the kernel computes it (`CPUBackend.row_limit`)
    identity: bool  # logical expert e is slot e (no replicas)


class FusedDecode:
    """Runs a model's decode steps through the fused layer kernels where they apply (see above)."""

    def __init__(self, max_rows: int = FUSED_ROWS):
        self.max_rows = max_rows  # most sequences a fused step takes
        self._dense: dict[int, _Dense] = {}
        self._experts: dict[int, _Experts] = {}
        self._pools: dict[int, tuple[torch.Tensor, np.ndarray, np.ndarray]] = {}
        self._covers: dict[int, bool] = {}

    def takes(self, batch: StepBatch) -> bool:
        """Whether this step is fused: every sequence decodes one token, and at most max_rows of them."""
        T = batch.input_ids.shape[0]
        return 0 < T <= self.max_rows and batch.num_single == T

    def covers(self, layer) -> bool:
        """Whether this decoder layer runs fused: its kinds of attention and weights (decided on its
        first step), and the MoE block's settings now (a capacity can be set after load)."""
        fits = self._covers.get(layer.index)
        if fits is None:
            fits = self._covers[layer.index] = _fusable(layer)
        mlp = layer.mlp
        return fits and mlp.capacity is None and type(mlp.dispatcher) is LocalDispatcher \
            and isinstance(mlp.backend, CPUBackend)

    def run(self, layers: list, h: torch.Tensor, batch: StepBatch, cache: PagedKVCache, cos: torch.Tensor,
            sin: torch.Tensor, probe=None) -> torch.Tensor:
        """Every layer on h [T, D] (fused ones update it in place; h must be this step's own tensor).
        probe: None, or one that does not time phases (`moetune.probe.times_phases`): it hears each
        fused layer's routing through `routed(layer, RouterOutput, None, 1)`."""
        step = _Step(batch, cos, sin, current_threads())
        for layer in layers:
            if self.covers(layer):
                self._layer(layer, h, step, cache, probe)
            else:
                h = layer(h, batch, cache, cos, sin, probe).contiguous()
        return h

    @torch.inference_mode()
    def warm(self, model) -> None:
        """Compile the kernels for this model's formats (or load them from numba's disk cache:
        compiling takes ~15 s here) at load time: one token through the fused layers alone, on a
        throwaway one-block cache."""
        layers = [layer for layer in model.layers if self.covers(layer)]
        if not layers:
            return
        bs = 16
        cache = model.new_cache(1, bs)

        def one(v: int) -> torch.Tensor:
            return torch.tensor([v], dtype=torch.int64, device=model.device)

        batch = StepBatch(one(0), one(0), [1], [1], one(bs), one(1)[None], StepKind.DECODE, num_single=1)
        h = model.embed[batch.input_ids]  # [1, D]
        cos, sin = model.rotary.cos_sin(batch.positions, h.dtype, 1)
        self.run(layers, h, batch, cache, cos, sin)

    def _layer(self, layer, h: torch.Tensor, step: "_Step", cache: PagedKVCache, probe) -> None:
        x, topk_w, topk_ids = self._attention_half(layer, h.numpy(), step, cache)
        self._moe_half(layer.mlp, h, x, topk_w, topk_ids, step, probe)

    def _attention_half(self, layer, h: np.ndarray, step: "_Step", cache: PagedKVCache):
        """`attention_block`: h [T, D] updated in place → (x [T, D] the MoE input, topk_w, topk_ids [T, K])."""
        attn, mlp = layer.attention, layer.mlp
        s, router, d = attn.spec, mlp.spec.router, self._dense_of(layer)
        k_pool, v_pool = self._pool_of(cache, layer.index)
        plan = attn.decode_plan(step.batch, step.batch.num_seqs, cache.block_size)
        T, D, K = h.shape[0], h.shape[1], router.top_k
        x = np.empty((T, D), np.float32)
        topk_w, topk_ids = np.empty((T, K), np.float32), np.empty((T, K), np.int64)
        jit_layer().attention_block(
            h, d.norm1, d.norm2, d.eps, d.wqkv, d.ones_qkv, d.bqkv, d.wo, d.ones_o, d.bo,
            s.num_heads, s.num_kv_heads, s.head_dim, QK_KINDS[s.qk_norm], d.q_norm, d.k_norm, d.qk_eps,
            float(s.clip_qkv or 0.0), step.cos, step.sin, step.rows, k_pool, v_pool, plan.tables, plan.lens,
            cache.block_size, float(attn.scale), plan.window, plan.scores, plan.read,
            d.wg, d.ones_g, d.bias, mlp.selection_bias is not None, router.score == "sigmoid", K,
            router.renormalize, float(router.scaling_factor), step.threads, SERIAL_BYTES, x, topk_w, topk_ids,
            runtime.INT8_ROW)
        return x, topk_w, topk_ids

    def _moe_half(self, mlp: MoELayer, h: torch.Tensor, x: np.ndarray, topk_w: np.ndarray, topk_ids: np.ndarray,
                  step: "_Step", probe) -> None:
        """The store's seams, then `moe_block` (h += the MoE output, in place); the unfused phases
        when the kernel does not take the experts the store handed out."""
        i, ids, xt = mlp.layer, torch.from_numpy(topk_ids), torch.from_numpy(x)
        if mlp.tap is not None:  # the engine's routing record (engine/routing.py), as in the unfused layer
            mlp.tap(i, ids)
        weights = mlp.store.acquire(i, ids)
        mlp.store.prefetch(i, ids, xt)
        e = self._experts_of(mlp, weights, xt)
        done = 2  # a format the kernel does not take
        if e is not None:
            D = x.shape[1]
            shared = mlp.shared(xt).float().contiguous().numpy() if mlp.shared is not None else _EMPTY.reshape(0, D)
            slots = topk_ids if weights.slots.identity else \
                weights.slots.physical(ids).to(torch.int64).contiguous().numpy()
            done = jit_layer().moe_block(h.numpy(), x, slots, topk_w, e.slots, e.w13, e.s13, e.w2, e.s2, e.nbytes,
                                         e.row_limit, shared, mlp.shared is not None, step.threads, SERIAL_BYTES,
                                         BLOCK_13, BLOCK_2, SCHEDULES[SCHEDULE], runtime.INT8_ROW)
        self._finish(mlp, h, xt, RouterOutput(torch.from_numpy(topk_w), ids, None), weights, done, probe)

    @staticmethod
    def _finish(mlp: MoELayer, h: torch.Tensor, xt: torch.Tensor, routed: RouterOutput, weights, done: int,
                probe) -> None:
        """After `moe_block` returned `done` for this layer: tell the probe, or run the unfused phases."""
        if done == 1:
            raise ValueError(f"layer {mlp.layer}: a slot id outside [0, {weights.num_slots})")
        if done == 2:  # or an expert with more rows than the kernel is faster for: the unfused phases
            h.add_(mlp.run_experts(xt, routed, weights))  # (which tell the probe)
        elif probe is not None:  # one that counts routing only (`run`)
            probe.routed(mlp.layer, routed, None, 1)

    def _dense_of(self, layer) -> _Dense:
        d = self._dense.get(layer.index)
        ptr = weight_tensors(layer.attention.qkv.weight)[0].data_ptr()
        if d is None or d.ptr != ptr:
            d = self._dense[layer.index] = _dense_arrays(layer, ptr)
        return d

    def _pool_of(self, cache: PagedKVCache, i: int) -> tuple[np.ndarray, np.ndarray]:
        k, v = cache.layers[i]
        got = self._pools.get(i)
        if got is None or got[0] is not k:
            got = self._pools[i] = (k, k.numpy(), v.numpy())
        return got[1], got[2]

    def _experts_of(self, mlp: MoELayer, weights, x: torch.Tensor) -> _Experts | None:
        i = mlp.layer
        got = self._experts.get(i)
        if got is not None and got.weights is weights:
            return got
        if weights.mixed or not kernel_takes(x, weights) or weights.w13.fmt == WeightFormat.INT4:
            return None
        w13, w2 = weights.w13, weights.w2
        P, two_i, D = w13.data.shape
        s13 = ones(P, two_i) if w13.scale is None else w13.scale.float().contiguous()
        s2 = ones(P, D) if w2.scale is None else w2.scale.float().contiguous()
        got = self._experts[i] = _Experts(weights, w13.data.contiguous().numpy(), s13.numpy(),
                                          w2.data.contiguous().numpy(), s2.numpy(), weight_bytes(w13, w2),
                                          weights.num_slots, mlp.backend.row_limit(weights), weights.slots.identity)
        return got


class _Step:
    """What every fused layer of one step shares: the batch (whose memo holds the decode attention
    plan, `GQAAttention.decode_plan`), cos/sin and cache rows as numpy, and the threads."""

    def __init__(self, batch: StepBatch, cos: torch.Tensor, sin: torch.Tensor, threads: int):
        self.batch = batch
        self.cos, self.sin = cos.contiguous().numpy(), sin.contiguous().numpy()  # [T, Dh] each
        self.rows = batch.slot_mapping.numpy()  # [T] int64
        self.threads = threads


def _fusable(layer) -> bool:
    """What does not change after load: GQA + MoE, the rotary the kernel takes, routing without
    group limits, fp32 CPU weights outside the store (int8 QKV and o projections too)."""
    attn, mlp = layer.attention, layer.mlp
    if not isinstance(attn, GQAAttention) or not isinstance(mlp, MoELayer):
        return False
    rotary, s = attn.rotary, attn.spec
    return (attn.decode_kernel and rotary.kernel and not rotary.interleave
            and rotary.inv_freq.shape[0] * 2 == s.head_dim and takes_routing(mlp.spec.router)
            and all(_takes_weight(w) for w in (attn.qkv.weight, attn.o.weight))
            and all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.int8, torch.uint8)
                    for t in layer.tensors())
            and all(t.dtype == torch.float32 for t in _float_tensors(layer)))


def _takes_weight(w) -> bool:
    """A projection the fused kernel reads: fp32, or int8 with a scale per row (int4 runs unfused)."""
    if isinstance(w, PackedWeight):
        return w.fmt == WeightFormat.INT8
    return w.dtype == torch.float32


def _float_tensors(layer) -> list[torch.Tensor]:
    """The layer's tensors other than packed projection data (norms, biases, router, shared expert)."""
    packed = {id(t) for t in layer.tensors() if t.dtype in (torch.int8, torch.uint8)}
    return [t for t in layer.tensors() if id(t) not in packed]


def _data_scale(w) -> tuple[np.ndarray, np.ndarray]:
    """A projection's rows and per-row scales as the kernel takes them (ones for fp32)."""
    if isinstance(w, PackedWeight):
        return w.data.contiguous().numpy(), w.scale.float().contiguous().numpy()
    return w.detach().contiguous().numpy(), ones(w.shape[0]).numpy()


def _dense_arrays(layer, ptr: int) -> _Dense:
    attn, mlp = layer.attention, layer.mlp

    def view(t: torch.Tensor | None) -> np.ndarray:
        return _EMPTY if t is None else t.detach().contiguous().numpy()

    (wqkv, sqkv), (wo, so) = _data_scale(attn.qkv.weight), _data_scale(attn.o.weight)
    return _Dense(
        ptr, view(layer.attn_norm.weight), view(layer.mlp_norm.weight), float(layer.attn_norm.eps),
        wqkv, sqkv, view(attn.qkv.bias), wo, so, view(attn.o.bias), view(attn.q_norm.weight if attn.q_norm else None),
        view(attn.k_norm.weight if attn.k_norm else None), float(attn.q_norm.eps if attn.q_norm else 0.0),
        view(mlp.gate_weight), ones(mlp.gate_weight.shape[0]).numpy(),
        view(mlp.selection_bias.float() if mlp.selection_bias is not None else torch.ones(1)))
