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
outputs agree to rounding (tests compare them). The kernels take one typed record per module
(`kernels/cpu/records.py`), each made by its owner: the norms' and attention's `kernel_record`, the
MoE layer's `kernel_router`, the backend's `kernel_experts` of the store's weights, the cache's
`kernel_pools`; the layer's records are made on its first fused step and kept (`LayerRecords`),
the step's (rows, plan, tuning) once per step. A step is fused when no probe that times phases is
attached (the profiler times the unfused layer's phases; serve's live expert-load window only
counts routing and hears it from here), every sequence decodes one token or verifies its draft
(a verify entry's 1 + k rows: each row attends as a query of its own over its sequence's cache up
to its position, `GQAAttention.row_plan`) and there are at most FUSED_ROWS rows; a layer, when it is grouped-query attention and an MoE block the kernels take:
`cpu` backend, one rank, no capacity limit, routing without group limits. Its experts run fused
when the store hands out one fp32, int8 or int4 format and no slot has more rows than the backend's
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

from typing import NamedTuple

import numpy as np
import torch

from moetune.kernels.cpu import records
from moetune.kernels.cpu.attention import DecodePlan
from moetune.kernels.cpu.experts import tuning
from moetune.kernels.cpu.routing import takes_routing
from moetune.kernels.cpu.runtime import current_threads, jit_layer
from moetune.kernels.quant_formats import PackedWeight, WeightFormat
from moetune.model.attention import GQAAttention
from moetune.model.batch import StepBatch, StepKind
from moetune.model.kv_cache import PagedKVCache
from moetune.model.linear import weight_tensors
from moetune.moe.cpu_backend import CPUBackend
from moetune.moe.dispatch import LocalDispatcher
from moetune.moe.layer import MoELayer
from moetune.moe.router import RouterOutput

FUSED_ROWS = 64  # decode steps of up to this many sequences are fused (see the module docstring)


class LayerRecords(NamedTuple):
    """One decoder layer's records that do not change between steps, each from its module, as the
    kernels take them (`records.plain`; made on the layer's first fused step, `ptr` notices a weight
    moved since)."""
    ptr: int
    attn_norm: tuple  # records.Norm: `RMSNorm.kernel_record`
    attention: tuple  # records.Attention: `GQAAttention.kernel_record`
    mlp_norm: tuple  # records.Norm
    router: tuple  # records.Router: `MoELayer.kernel_router`
    top_k: int

    @classmethod
    def of(cls, layer, ptr: int) -> "LayerRecords":
        router = layer.mlp.kernel_router()
        return cls(ptr, records.plain(layer.attn_norm.kernel_record()), records.plain(layer.attention.kernel_record()),
                   records.plain(layer.mlp_norm.kernel_record()), records.plain(router), router.top_k)


class FusedDecode:
    """Runs a model's decode steps through the fused layer kernels where they apply (see above)."""

    def __init__(self, max_rows: int = FUSED_ROWS, verify: bool = True):
        self.max_rows = max_rows  # most rows a fused step takes
        self.verify = verify  # verify steps fused too (False: only one-token rows, as before; an A/B switch)
        self._records: dict[int, LayerRecords] = {}
        self._experts: dict[int, tuple[object, tuple | None]] = {}  # layer → (weights, plain records.Experts)
        self._covers: dict[int, bool] = {}

    def takes(self, batch: StepBatch) -> bool:
        """Whether this step is fused: at most max_rows rows, every one a decode token or a row of a
        verify entry (a decode step with drafts: no prompt rows)."""
        T = batch.input_ids.shape[0]
        return 0 < T <= self.max_rows and (batch.num_single == T or self.verify and batch.kind is StepKind.DECODE)

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
        """The unfused layer's phases: attention (+ its norm and residual) → norm → router in one
        kernel call; the routing record, the store's acquire and prefetch, the shared expert in
        Python; permute → experts → unpermute (+ residual) in another."""
        hn = h.numpy()  # [T, D], a view made once for both halves
        x, topk_w, topk_ids = self._attention_half(layer, hn, step, cache)
        self._moe_half(layer.mlp, h, hn, x, topk_w, topk_ids, step, probe)

    def _attention_half(self, layer, h: np.ndarray, step: "_Step", cache: PagedKVCache):
        """`attention_block`: h [T, D] updated in place → (x [T, D] the MoE input, topk_w, topk_ids [T, K])."""
        r = self._records_of(layer)
        plan = step.plan_of(layer.attention, cache.block_size)
        T, D, K = h.shape[0], h.shape[1], r.top_k
        x = np.empty((T, D), np.float32)
        topk_w, topk_ids = np.empty((T, K), np.float32), np.empty((T, K), np.int64)
        jit_layer().attention_block(h, r.attn_norm, r.attention, step.rows, tuple(cache.kernel_pools(layer.index)),
                                    plan, r.mlp_norm, r.router, step.tuning, x, topk_w, topk_ids)
        return x, topk_w, topk_ids

    def _moe_half(self, mlp: MoELayer, h: torch.Tensor, hn: np.ndarray, x: np.ndarray, topk_w: np.ndarray,
                  topk_ids: np.ndarray, step: "_Step", probe) -> None:
        """The store's seams, then `moe_block` (h += the MoE output, in place; hn = h.numpy()); the
        unfused phases when the kernel does not take the experts the store handed out."""
        i, ids, xt = mlp.layer, torch.from_numpy(topk_ids), torch.from_numpy(x)
        if mlp.tap is not None:  # the engine's routing record (engine/routing.py), as in the unfused layer
            mlp.tap(i, ids)
        weights = mlp.store.acquire(i, ids)
        mlp.store.prefetch(i, ids, xt)
        experts = self._experts_of(mlp, weights)
        done = 2  # a format the kernel does not take
        if experts is not None:
            use_shared = mlp.shared is not None
            shared = mlp.shared(xt).float().contiguous().numpy() if use_shared else records.EMPTY.reshape(0, x.shape[1])
            slots = topk_ids if weights.slots.identity else \
                weights.slots.physical(ids).to(torch.int64).contiguous().numpy()  # [T, K]
            done = jit_layer().moe_block(hn, x, slots, topk_w, experts, shared, use_shared, step.tuning)
        if done or probe is not None:  # the routing as a RouterOutput only for those who read it
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

    def _records_of(self, layer) -> LayerRecords:
        r = self._records.get(layer.index)
        ptr = weight_tensors(layer.attention.qkv.weight)[0].data_ptr()
        if r is None or r.ptr != ptr:
            r = self._records[layer.index] = LayerRecords.of(layer, ptr)
        return r

    def _experts_of(self, mlp: MoELayer, weights) -> tuple | None:
        """The record of the experts the store handed out, plain (made when they are not the last ones)."""
        got = self._experts.get(mlp.layer)
        if got is None or got[0] is not weights:
            e = mlp.backend.kernel_experts(weights)
            got = self._experts[mlp.layer] = (weights, None if e is None else records.plain(e))
        return got[1]


class _Step:
    """What every fused layer of one step shares: the batch (whose memo holds the decode attention
    plan, `GQAAttention.decode_plan`), the rotary and cache rows, and the kernels' tuning, as the
    kernels take them (`records.plain`)."""

    def __init__(self, batch: StepBatch, cos: torch.Tensor, sin: torch.Tensor, threads: int):
        self.batch = batch
        self.rows = records.plain(records.StepRows(cos.contiguous().numpy(), sin.contiguous().numpy(),  # [T, Dh]
                                                   batch.slot_mapping.numpy()))  # [T] int64
        self.tuning = records.plain(tuning(threads))
        self._plans: dict[int, tuple] = {}  # id(DecodePlan) → plain (the batch's memo keeps the plan alive)
        self._of: dict[tuple, tuple] = {}  # (attention.plan_shape(), block size) → the plain plan

    def plan_of(self, attention: GQAAttention, block_size: int) -> tuple:
        """`plan(attention.row_plan(...))`, made by the first layer of its `plan_shape` in the step
        (the batch's memo, keyed on the same values, returns that plan to the others: the lookup
        here skips building its key and closure per layer)."""
        key = (attention.plan_shape(), block_size)
        got = self._of.get(key)
        if got is None:
            got = self._of[key] = self.plan(attention.row_plan(self.batch, block_size))
        return got

    def plan(self, plan: DecodePlan) -> tuple:
        """A layer's `DecodePlan` (the same object for every layer of a window) as the kernel takes it."""
        got = self._plans.get(id(plan))
        if got is None:
            got = self._plans[id(plan)] = tuple(plan)
        return got


def _fusable(layer) -> bool:
    """What does not change after load: GQA + MoE, the rotary the kernel takes, routing without
    group limits, fp32 CPU weights outside the store (int8 and int4 QKV and o projections too)."""
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
    """A projection the fused kernel reads: fp32, int8 with a scale per row, or int4 with one per group."""
    if isinstance(w, PackedWeight):
        return w.fmt in (WeightFormat.INT8, WeightFormat.INT4)
    return w.dtype == torch.float32


def _float_tensors(layer) -> list[torch.Tensor]:
    """The layer's tensors other than packed projection data (norms, biases, router, shared expert)."""
    packed = {id(t) for t in layer.tensors() if t.dtype in (torch.int8, torch.uint8)}
    return [t for t in layer.tensors() if id(t) not in packed]
