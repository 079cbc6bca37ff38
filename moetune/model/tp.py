"""Tensor parallelism inside one token stream: G ranks hold slices of the weights and agree by collectives.

A TP group is G ranks that see the same tokens (the same requests, the same hidden states). With
`attention` split (parallel.tp_size = G):
- attention: the fused QKV is column-parallel by heads (H/G query heads per rank; KV heads split
  Hkv/G per rank, or one replicated KV head per rank when Hkv < G); MLA by heads (q_b / kv_b's
  W_UK, W_UV / o_proj; the latent down-projection and the latent cache are whole on every rank);
  o_proj is row-parallel: each rank's output is a partial sum, all-reduced (`tp_allreduce`);
- dense MLPs: gate/up column-parallel, down row-parallel, all-reduced;
- embedding and LM head vocab-parallel: rank t holds vocab rows [t·V/G, (t+1)·V/G); the embedding
  is zero outside them and all-reduced (`tp_embed`); the logits are all-gathered before sampling
  (`tp_gather`), so every rank samples from the same full row.
With `experts` split (parallel.expert_tp_size = G) every routed and shared expert's intermediate
dim is split (w13 rows, w2 columns): the MoE layer's output is a partial sum, all-reduced.
A part not split is whole (replicated) on every rank of the group and computed on each alike.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from moetune.spec import GQASpec, LayerSpec, MLASpec, ModelSpec


@dataclass(frozen=True)
class TPPlan:
    """Rank `rank` of a tensor-parallel group of `size` ranks (picklable: no process group)."""

    size: int  # G
    rank: int  # t, in [0, G)
    attention: bool  # attention, dense MLPs, embedding, LM head split over the group
    experts: bool  # routed and shared experts' intermediate dim split over the group

    def part(self, n: int) -> tuple[int, int]:
        """[start, stop) of this rank's share of n rows split evenly."""
        step = n // self.size
        return self.rank * step, (self.rank + 1) * step

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """[first, stop) of the KV heads this rank holds: Hkv/G of them, or the one its query heads
        read when Hkv < G (then G/Hkv ranks hold a copy of it)."""
        if num_kv_heads >= self.size:
            return self.part(num_kv_heads)
        head = self.rank // (self.size // num_kv_heads)
        return head, head + 1


def plan_of(tp_size: int, expert_tp_size: int, rank: int) -> TPPlan | None:
    """The plan of rank `rank` (within its group); None when nothing is split."""
    size = max(tp_size, expert_tp_size)
    if size == 1:
        return None
    return TPPlan(size, rank, tp_size > 1, expert_tp_size > 1)


def local_spec(spec: ModelSpec, plan: TPPlan | None) -> ModelSpec:
    """The shapes this rank computes: its heads, its dense and expert intermediate slices (vocab,
    hidden size and experts unchanged: the embedding's split is the model's, not the spec's)."""
    if plan is None:
        return spec
    G, out = plan.size, spec
    if plan.attention:
        att = spec.attention
        if isinstance(att, GQASpec):
            first, stop = plan.kv_heads(att.num_kv_heads)
            att = dataclasses.replace(att, num_heads=att.num_heads // G, num_kv_heads=stop - first)
        elif isinstance(att, MLASpec):
            att = dataclasses.replace(att, num_heads=att.num_heads // G)
        layers = tuple(LayerSpec(x.index, x.is_moe, x.dense_intermediate // G) for x in spec.layers)
        out = dataclasses.replace(out, attention=att, layers=layers)
    if plan.experts:
        moe = dataclasses.replace(spec.moe, intermediate_size=spec.moe.intermediate_size // G,
                                  shared_intermediate_size=spec.moe.shared_intermediate_size // G)
        out = dataclasses.replace(out, moe=moe)
    return out


class TPComm:
    """The group's collectives, with the bytes each moved (payload bytes: a [T, D] all-reduce counts
    T·D·itemsize, an all-gather the gathered [N, V]); `take()` hands them to the profiler per step."""

    def __init__(self, plan: TPPlan, group: Any = None, device: torch.device | None = None):
        self.plan, self.group = plan, group  # group None: the default (world) process group
        self.device = device or torch.device("cpu")
        self.bytes: dict[tuple[int, str], list[int]] = {}  # (layer, phase) → [bytes, calls] since the last take()
        self.calls = 0
        self.seconds = 0.0  # inside the collectives, since the communicator was made (benchmarks read it)
        self.seconds_by: dict[str, float] = {}  # the same per phase (tp_allreduce, tp_embed, tp_gather)

    def all_reduce(self, x: torch.Tensor, layer: int, phase: str = "tp_allreduce") -> torch.Tensor:
        """Sum of x [T, D] over the group (in place; x must be this rank's own tensor)."""
        import torch.distributed as dist

        start = time.perf_counter()
        if x.shape[0]:
            dist.all_reduce(x, group=self.group)
        self._count(layer, phase, x, start)
        return x

    def gather_vocab(self, x: torch.Tensor, layer: int = -1) -> torch.Tensor:
        """x [N, V/G] of this rank's vocab slice → [N, V] (rank-major columns)."""
        import torch.distributed as dist

        start = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.plan.size)]
        if x.shape[0]:
            dist.all_gather(parts, x.contiguous(), group=self.group)
        out = torch.cat(parts, dim=1) if x.shape[0] else x.new_empty(0, x.shape[1] * self.plan.size)
        self._count(layer, "tp_gather", out, start)
        return out

    def embed(self, table: torch.Tensor, ids: torch.Tensor, layer: int = -1) -> torch.Tensor:
        """Rows of the vocab-parallel embedding: table [V/G, D] holds ids [start, start + V/G)."""
        rows = table.shape[0]
        start = self.plan.rank * rows
        local = ids - start  # [T]
        mine = (local >= 0) & (local < rows)  # [T]
        h = table[local.clamp(0, rows - 1)] * mine[:, None].to(table.dtype)  # [T, D]
        return self.all_reduce(h, layer, "tp_embed")

    def agree(self, tokens: list[int | None]) -> list[int | None]:
        """The group's rank 0's sampled tokens on every rank (a sampling RNG may differ between
        processes; greedy rows agree already, since every rank holds the same gathered logits).
        None (a sequence whose sampling failed) travels as -1."""
        import torch.distributed as dist

        t = torch.tensor([-1 if x is None else x for x in tokens], dtype=torch.long, device=self.device)
        if self.group is None:
            dist.broadcast(t, src=0)
        else:
            dist.broadcast(t, group=self.group, group_src=0)
        return [None if x < 0 else x for x in t.tolist()]

    def agree_lists(self, lists: list[list[int]]) -> list[list[int]]:
        """The group's rank 0's token lists on every rank (speculative verification: each list is
        the 1 .. k + 1 tokens a verify entry keeps, [] where its sampling failed)."""
        import torch.distributed as dist

        lengths = torch.tensor([len(x) for x in lists], dtype=torch.long, device=self.device)  # [S]
        if self.group is None:
            dist.broadcast(lengths, src=0)
        else:
            dist.broadcast(lengths, group=self.group, group_src=0)
        flat = [t for x in lists for t in x] if self.plan.rank == 0 else [0] * int(lengths.sum())
        tokens = self.agree(flat) if flat else []
        out, at = [], 0
        for n in lengths.tolist():
            out.append(tokens[at : at + n])
            at += n
        return out

    def take(self) -> dict[tuple[int, str], list[int]]:
        """(layer, phase) → [bytes, calls] counted since the last take (and forget them)."""
        out, self.bytes = self.bytes, {}
        return out

    def _count(self, layer: int, phase: str, x: torch.Tensor, start: float) -> None:
        took = time.perf_counter() - start
        self.seconds += took
        self.seconds_by[phase] = self.seconds_by.get(phase, 0.0) + took
        cell = self.bytes.setdefault((layer, phase), [0, 0])
        cell[0] += x.numel() * x.element_size()
        cell[1] += 1
        self.calls += 1
