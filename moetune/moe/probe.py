"""The hook the model calls around each phase. With no probe attached it costs one `is None` test.

`moetune.profile` implements `Probe`; the model only knows this protocol (dependencies point one
way: profile → engine → moe/model).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from moetune.moe.permute import PermuteOutput
    from moetune.moe.router import RouterOutput

PHASES = ("router", "permute", "dispatch", "experts", "combine", "unpermute")
OTHER_PHASES = ("attention", "shared_expert", "dense_mlp", "offload_wait", "other")

_NULL = nullcontext()


class Probe(Protocol):
    def phase(self, layer: int, name: str) -> AbstractContextManager: ...

    def routed(self, layer: int, route: "RouterOutput", permute: "PermuteOutput") -> None: ...


def phase_scope(probe: Probe | None, layer: int, name: str) -> AbstractContextManager:
    return _NULL if probe is None else probe.phase(layer, name)
