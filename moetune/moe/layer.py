"""MoELayer: reads as the phase list of docs/architecture.md §2, each phase wrapped by the probe hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from typing import Callable, Protocol

from moetune.experts.store import ExpertStore, ExpertWeights
from moetune.kernels.cpu.records import Router
from moetune.kernels.cpu.routing import router_record
from moetune.moe.backend import MoEBackend
from moetune.moe.torch_backend import TorchBackend
from moetune.moe.dispatch import Dispatcher, LocalDispatcher
from moetune.moe.capacity import apply_capacity, capacity_of
from moetune.moe.passes import gather_passes, run_pass
from moetune.moe.router import RouterOutput, route
from moetune.probe import Probe, phase_scope
from moetune.spec import MoESpec


class FeedForward(Protocol):
    """A dense gated MLP (the model's `GatedMLP`): called on [T, D], lists its weights."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def tensors(self) -> list[torch.Tensor]: ...


@dataclass
class SharedExpert:
    mlp: FeedForward
    gate: torch.Tensor | None = None  # [1, D]: qwen2_moe scales the output by sigmoid(x @ gate.T)

    def tensors(self) -> list[torch.Tensor]:
        return self.mlp.tensors() + ([self.gate] if self.gate is not None else [])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, D]
        out = self.mlp(x)
        if self.gate is not None:
            out = torch.sigmoid(x @ self.gate.t()) * out  # [T, 1] * [T, D]
        return out


class MoELayer:
    def __init__(
        self,
        layer: int,
        spec: MoESpec,
        gate_weight: torch.Tensor,  # [E, D]
        selection_bias: torch.Tensor | None,  # [E]
        store: ExpertStore,
        shared: SharedExpert | None = None,
        backend: MoEBackend | None = None,
        dispatcher: Dispatcher | None = None,
    ):
        self.layer = layer
        self.spec = spec
        self.gate_weight = gate_weight
        self.selection_bias = selection_bias
        self.store = store
        self.shared = shared
        self.backend: MoEBackend = backend or TorchBackend()
        self.dispatcher: Dispatcher = dispatcher or LocalDispatcher()
        self.probe: Probe | None = None
        self.capacity: tuple[float, str] | None = None  # (factor, "drop" | "reroute" | "buffer"), moe/capacity.py
        self.dropped = self.rerouted = self.buffered = 0  # copies, counted while a capacity is set
        self.tap: Callable[[int, torch.Tensor], None] | None = None  # hears (layer, topk_ids [T, K]) each call

    def tensors(self) -> list[torch.Tensor]:
        """Router and shared-expert weights; the routed experts belong to the ExpertStore."""
        own = [self.gate_weight] + ([self.selection_bias] if self.selection_bias is not None else [])
        return own + (self.shared.tensors() if self.shared is not None else [])

    def _limit(self, routed: RouterOutput) -> tuple[RouterOutput, torch.Tensor]:
        """The routing under capacity and the mask [T, K] of the copies beyond it."""
        factor, policy = self.capacity
        T, K = routed.topk_ids.shape
        cap = capacity_of(factor, T, K, self.spec.num_experts)
        out = apply_capacity(routed.topk_ids, routed.topk_weights, routed.logits, cap, policy)
        self.dropped += out.dropped
        self.rerouted += out.rerouted
        self.buffered += out.buffered
        return RouterOutput(out.topk_weights, out.topk_ids, routed.logits), out.over

    def kernel_router(self) -> Router:
        """This layer's router as the fused decode layer's kernel takes it (fp32 CPU gate: a view)."""
        return router_record(self.gate_weight, self.spec.router, self.selection_bias)

    def reset_counts(self) -> None:
        self.dropped = self.rerouted = self.buffered = 0

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """This layer's router applied to `x` [T, D] → topk_ids [T, K] (offload prefetch from an earlier layer)."""
        backend = self.backend
        return route(x, self.gate_weight, self.spec.router, self.selection_bias, backend.select_experts,
                     backend.router_logits).topk_ids

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, D] → [T, D]
        probe, i, backend = self.probe, self.layer, self.backend
        with phase_scope(probe, i, "router"):
            routed = route(x, self.gate_weight, self.spec.router, self.selection_bias, backend.select_experts,
                           backend.router_logits)
            over = None
            if self.capacity is not None:
                routed, over = self._limit(routed)
        if self.tap is not None:
            self.tap(i, routed.topk_ids)
        with phase_scope(probe, i, "offload_wait"):
            weights = self.store.acquire(i, routed.topk_ids)
        self.store.prefetch(i, routed.topk_ids, x)
        if over is None:
            return self.run_experts(x, routed, weights)
        return self.run_limited(x, routed, weights, over)

    def run_experts(self, x: torch.Tensor, routed: RouterOutput, weights: ExpertWeights) -> torch.Tensor:
        """The phases after the router and the store: permute → dispatch → experts → combine →
        unpermute (+ the shared expert), on x [T, D] routed by `routed` → [T, D]."""
        probe, i, backend = self.probe, self.layer, self.backend
        with phase_scope(probe, i, "permute"):
            perm = backend.permute(x, weights.slots.physical(routed.topk_ids), weights.slots.num_slots)
        with phase_scope(probe, i, "dispatch"):
            sent = self.dispatcher.dispatch(perm)
        with phase_scope(probe, i, "experts"):
            computed = backend.experts(sent.x, sent.offsets, weights)
        with phase_scope(probe, i, "combine"):
            back = self.dispatcher.combine(computed.y, sent)
        shared_out = None
        if self.shared is not None:
            with phase_scope(probe, i, "shared_expert"):
                shared_out = self.shared(x)
        with phase_scope(probe, i, "unpermute"):
            out = backend.unpermute(back.y_sorted, perm.sorted_copy_ids, routed.topk_weights, shared_out)
        if probe is not None:
            probe.routed(i, routed, perm, computed.block_m)
            probe.moved(i, sent.bytes_sent, back.bytes_sent)
        return out

    def run_limited(self, x: torch.Tensor, routed: RouterOutput, weights: ExpertWeights,
                    over: torch.Tensor) -> torch.Tensor:
        """Under a capacity (moe/passes.py): pass 1 over the copies within it, pass 2 (`buffer`) over
        the rest as the phase `overflow`, one unpermute over all T·K copies; x [T, D] → [T, D]."""
        probe, i, backend = self.probe, self.layer, self.backend
        T, K = routed.topk_ids.shape
        with phase_scope(probe, i, "permute"):
            slots = weights.slots.physical(routed.topk_ids)  # [T, K] physical slot of each copy
            beyond = over.reshape(-1)  # [T*K]
            within = ~beyond
        passes = [run_pass(x, within, slots, weights.slots.num_slots, weights, backend, self.dispatcher, probe, i)]
        if self.capacity[1] == "buffer":  # every rank runs the pass, empty or not: the collectives line up
            with phase_scope(probe, i, "overflow"):
                passes.append(run_pass(x, beyond, slots, weights.slots.num_slots, weights, backend,
                                       self.dispatcher, None, i))
        shared_out = None
        if self.shared is not None:
            with phase_scope(probe, i, "shared_expert"):
                shared_out = self.shared(x)
        with phase_scope(probe, i, "unpermute"):
            y = gather_passes(passes, T * K, x)  # [T*K, D] in copy order
            out = backend.unpermute(y, torch.arange(T * K, device=x.device), routed.topk_weights, shared_out)
        if probe is not None:
            counts = sum(p.perm.counts for p in passes)  # [P] copies computed per slot
            probe.routed(i, routed, passes[0].perm._replace(counts=counts), passes[0].block_m)
            probe.moved(i, sum(p.bytes_sent[0] for p in passes), sum(p.bytes_sent[1] for p in passes))
        return out
