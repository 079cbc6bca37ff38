"""RoutingTrace: the top-k expert ids of every token in every MoE layer of every measured step.

Stored as `routing.npz` in a run dir (schema in SCHEMA.md) so the search simulator can replay a
workload without the model. N = tokens over all steps, Lm = MoE layers, S = steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

KINDS = ("prefill", "decode", "mixed")  # StepKind values, in their uint8 code order


@dataclass
class RoutingTrace:
    topk_ids: np.ndarray  # [N, Lm, K] uint8 (E <= 256) or uint16
    step_offsets: np.ndarray  # [S+1] int64: tokens of step s are rows step_offsets[s]:step_offsets[s+1]
    step_kind: np.ndarray  # [S] uint8: 0 = prefill, 1 = decode, 2 = mixed
    step_index: np.ndarray  # [S] int64: the step ids used by the Parquet tables
    layers: np.ndarray  # [Lm] int16: model layer index of each trace column
    num_experts: int
    token_rank: np.ndarray | None = None  # [N] int16: rank that computed each token (runs on R ranks)

    @property
    def num_steps(self) -> int:
        return len(self.step_index)

    def step(self, s: int) -> np.ndarray:
        """[T, Lm, K] routing of the s-th stored step."""
        return self.topk_ids[self.step_offsets[s] : self.step_offsets[s + 1]]

    def kind(self, s: int) -> str:
        return KINDS[int(self.step_kind[s])]

    def origin(self, s: int) -> np.ndarray | None:
        """[T] rank of each token of the s-th step (None: the run ran one process)."""
        if self.token_rank is None:
            return None
        return self.token_rank[self.step_offsets[s] : self.step_offsets[s + 1]].astype(np.int64)

    def save(self, path: Path) -> None:
        extra = {} if self.token_rank is None else {"token_rank": self.token_rank}
        np.savez_compressed(path, topk_ids=self.topk_ids, step_offsets=self.step_offsets,
                            step_kind=self.step_kind, step_index=self.step_index, layers=self.layers,
                            num_experts=np.int64(self.num_experts), **extra)

    @classmethod
    def load(cls, path: Path) -> "RoutingTrace":
        with np.load(path) as data:
            ranks = data["token_rank"] if "token_rank" in data.files else None
            return cls(data["topk_ids"], data["step_offsets"], data["step_kind"], data["step_index"],
                       data["layers"], int(data["num_experts"]), ranks)


def id_dtype(num_experts: int) -> np.dtype:
    return np.dtype(np.uint8) if num_experts <= 256 else np.dtype(np.uint16)


def replay_counts(trace: RoutingTrace) -> np.ndarray:
    """[S, Lm, E] token copies per step, layer and expert, recomputed from the ids alone."""
    S, Lm, E = trace.num_steps, len(trace.layers), trace.num_experts
    out = np.zeros((S, Lm, E), dtype=np.int64)
    for s in range(S):
        ids = trace.step(s).astype(np.int64)  # [T, Lm, K]
        for j in range(Lm):
            out[s, j] = np.bincount(ids[:, j].reshape(-1), minlength=E)
    return out
