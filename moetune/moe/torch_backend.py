"""The plain-torch backend: each phase's torch function, the twin every other backend is tested
against (and the base the CPU backend falls back to off its kernels' shapes)."""

from __future__ import annotations

from moetune.moe.experts import run_experts
from moetune.moe.permute import permute
from moetune.moe.router import router_logits, select_experts
from moetune.moe.unpermute import unpermute


class TorchBackend:
    name = "torch"

    def router_logits(self, x, gate_weight):
        return router_logits(x, gate_weight)

    def select_experts(self, logits, spec, bias):
        return select_experts(logits, spec, bias)

    def permute(self, x, slot_ids, num_slots):
        return permute(x, slot_ids, num_slots)

    def experts(self, x, offsets, weights):
        return run_experts(x, offsets, weights)

    def unpermute(self, y_sorted, sorted_copy_ids, topk_weights, shared):
        return unpermute(y_sorted, sorted_copy_ids, topk_weights, shared)
