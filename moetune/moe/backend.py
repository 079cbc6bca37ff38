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
from moetune.moe.experts import ExpertsOutput
from moetune.moe.permute import PermuteOutput
from moetune.moe.torch_backend import TorchBackend
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
