"""The hook the model calls around each phase. With no probe attached it costs one `is None` test.

`moetune.profile` implements `Probe`; the model and the MoE layer only know this protocol, which
lives in this leaf module so that nothing below the profiler imports it (docs/architecture.md §3).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

PHASES = ("router", "permute", "dispatch", "experts", "combine", "unpermute")
OTHER_PHASES = ("attention", "shared_expert", "dense_mlp", "offload_wait", "other")
TP_PHASES = ("tp_allreduce", "tp_embed", "tp_gather")  # tensor-parallel collectives (model/tp.py)

_NULL = nullcontext()


class Probe(Protocol):
    times_phases: bool  # False: listens to `routed` only; the model may then run layers fused, with no
    # phase boundaries inside (model/fused_decode.py), and calls `routed` with permute=None there

    def phase(self, layer: int, name: str) -> AbstractContextManager: ...

    def routed(self, layer: int, route: Any, permute: Any, block_m: int) -> None:
        """After a MoE layer: its RouterOutput, PermuteOutput, and the experts kernel's row block."""
        ...

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        """Activation bytes the layer's dispatcher sent to other ranks (0 with one rank)."""
        ...


def times_phases(probe: Probe | None) -> bool:
    """Whether `probe` needs the phases of every layer timed apart (no probe: no)."""
    return probe is not None and getattr(probe, "times_phases", True)


def phase_scope(probe: Probe | None, layer: int, name: str) -> AbstractContextManager:
    return _NULL if probe is None else probe.phase(layer, name)
