"""The 2-D mesh of ranks: ep_size data-parallel groups × G tensor-parallel ranks each.

Global rank r sits at (d, t) = (r // G, r % G): the G ranks of DP group d (consecutive ranks, so
a TP group stays inside a node when G divides the ranks per node) share one token stream and
split its weights (model/tp.py); the ep_size ranks with the same t form an expert-parallel group
whose all-to-all moves token copies between the DP groups (moe/all_to_all.py), each holding
P / ep_size expert slots. G = 1 is plain EP (today's layout); ep_size = 1 is plain TP.

`join_mesh` makes the process groups after the launcher has started the world (any launcher:
engine/ep_launch.py spawns or joins torchrun's ranks; a server's rank launch is the same): every
rank creates every group, in the same order, as torch.distributed requires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.config import ParallelConfig


@dataclass(frozen=True)
class Mesh:
    ep: int  # data-parallel (expert-parallel) groups
    tp: int  # G: ranks per tensor-parallel group
    tp_size: int = 1  # attention / dense split (1 or G)
    expert_tp_size: int = 1  # experts split (1 or G)

    @classmethod
    def of(cls, par: ParallelConfig) -> "Mesh":
        return cls(par.ep_size, par.group_size, par.tp_size, par.expert_tp)

    @property
    def world(self) -> int:
        return self.ep * self.tp

    def coords(self, rank: int) -> tuple[int, int]:
        """(d, t): the DP group of global rank `rank` and its place in the group's TP ranks."""
        return rank // self.tp, rank % self.tp

    def tp_ranks(self, d: int) -> list[int]:
        return [d * self.tp + t for t in range(self.tp)]

    def ep_ranks(self, t: int) -> list[int]:
        return [d * self.tp + t for d in range(self.ep)]

    def describe(self) -> dict:
        """The mesh as the run dir and reports state it."""
        return {"world": self.world, "ep_size": self.ep, "tp_group": self.tp, "tp_size": self.tp_size,
                "expert_tp_size": self.expert_tp_size,
                "rank_coords": {r: list(self.coords(r)) for r in range(self.world)}}


@dataclass(frozen=True)
class MeshGroups:
    """This rank's place in the mesh and its process groups (None: the default group, or no group)."""

    mesh: Mesh
    rank: int  # global
    dp_rank: int  # d
    tp_rank: int  # t
    tp_group: Any  # the G ranks of this DP group (None when G = 1 or when it is the whole world)
    ep_group: Any  # the ep ranks with this t (None when it is the whole world)


def join_mesh(mesh: Mesh, rank: int) -> MeshGroups:
    """Create the mesh's TP and EP process groups (collective: every rank calls it alike)."""
    import torch.distributed as dist

    d, t = mesh.coords(rank)
    tp_group = ep_group = None
    if mesh.tp > 1 and mesh.ep > 1:
        for dd in range(mesh.ep):
            group = dist.new_group(mesh.tp_ranks(dd))
            tp_group = group if dd == d else tp_group
        for tt in range(mesh.tp):
            group = dist.new_group(mesh.ep_ranks(tt))
            ep_group = group if tt == t else ep_group
    return MeshGroups(mesh, rank, d, t, tp_group, ep_group)
