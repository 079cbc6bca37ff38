"""Kernel backends for the MoE phases: `torch` (plain torch, runs anywhere), `cpu` (numba) and `triton`.

A backend supplies the compute of each phase; `MoELayer` keeps the phase order, the probe hooks,
the dispatcher and the named outputs, whose meaning is the same under every backend.
`resolve_backend("auto")` picks triton on CUDA and cpu elsewhere.
"""

from __future__ import annotations

import os
import sys
from typing import Protocol

import torch

from moetune.errors import MoetuneError
from moetune.experts.store import ExpertWeights
from moetune.moe.experts import ExpertsOutput, run_experts
from moetune.moe.permute import PermuteOutput, permute
from moetune.moe.router import router_logits, select_experts
from moetune.moe.unpermute import unpermute
from moetune.spec import RouterSpec

BACKENDS = ("torch", "cpu", "triton")


class MoEBackend(Protocol):
    name: str

    def router_logits(self, x: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor: ...

    def select_experts(self, logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def permute(self, x: torch.Tensor, slot_ids: torch.Tensor, num_slots: int) -> PermuteOutput: ...

    def experts(self, x: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> ExpertsOutput: ...

    def unpermute(self, y_sorted: torch.Tensor, sorted_copy_ids: torch.Tensor, topk_weights: torch.Tensor,
                  shared: torch.Tensor | None) -> torch.Tensor: ...


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


def _interpret_off_cuda(device: torch.device) -> None:
    """Triton compiles for CUDA; anywhere else its kernels run under the Triton interpreter (slow,
    for testing), which must be switched on before the kernels are first imported."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    if "moetune.kernels.moe_gemm" in sys.modules:
        raise MoetuneError("the Triton kernels were already imported for CUDA in this process; "
                           "set TRITON_INTERPRET=1 before starting to run them on the CPU")
    os.environ["TRITON_INTERPRET"] = "1"
    print(f"note: kernel backend 'triton' on {device.type} runs under the Triton interpreter (slow; for testing)",
          file=sys.stderr)


def resolve_backend(name: str, device: torch.device) -> MoEBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu"
    if name == "torch":
        return TorchBackend()
    if name == "cpu":
        if device.type != "cpu":
            raise MoetuneError(f"kernel backend 'cpu' runs on the CPU, not {device.type}; "
                               "choose --kernel-backend triton or torch there")
        from moetune.moe.cpu_backend import CPUBackend  # its own file; numba loads on the first kernel call

        return CPUBackend()
    if name == "triton":
        _interpret_off_cuda(device)
        from moetune.moe.triton_backend import TritonBackend  # imports triton: only when asked

        return TritonBackend()
    raise MoetuneError(f"unknown kernel backend '{name}' (choose from: auto, {', '.join(BACKENDS)})")
