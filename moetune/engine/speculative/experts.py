"""What a verify step costs an MoE model: the distinct experts each MoE layer computes for the
step's decode rows (every sequence's last token and its draft tokens) against the experts the
same step would have woken as a plain decode (the last tokens alone: the same tokens at the same
positions, so the same routing). Draft tokens of different sequences route to different experts,
so a verify step at batch B reads more expert weights than a decode at batch B; at batch 1 the
draft tokens mostly share the one sequence's experts.

Counted only on verify steps, by a routing probe put in front of the model's own probe (the
profiler's, the server's window) for the forward and taken away after; prefill rows of a mixed
step are left out of both counts.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from moetune.probe import times_phases

_NULL = nullcontext()


class VerifyExperts:
    def __init__(self):
        self.steps = 0  # verify steps counted
        self.verify = 0  # Σ over those steps and MoE layers: distinct experts of the decode rows
        self.plain = 0  # Σ likewise: distinct experts of the rows a plain decode computes
        self.layers = 0  # Σ MoE layers over those steps (verify / layers = experts per layer and step)

    @contextmanager
    def watching(self, model, decode_rows: list[int], plain_rows: list[int]):
        """Count the experts of the forward run inside this block (rows index the step's [T])."""
        inner = model.probe
        dev = model.device
        watch = _Watch(self, inner, torch.tensor(decode_rows, device=dev), torch.tensor(plain_rows, device=dev))
        model.attach_probe(watch)
        try:
            yield
        finally:
            model.attach_probe(inner)
        self.steps += 1


class _Watch:
    """A routing probe that counts distinct experts and passes everything on to the model's probe."""

    def __init__(self, counts: VerifyExperts, inner, decode_rows: torch.Tensor, plain_rows: torch.Tensor):
        self.counts, self.inner = counts, inner
        self.decode_rows, self.plain_rows = decode_rows, plain_rows  # [Td], [B]
        self.times_phases = times_phases(inner)

    def phase(self, layer: int, name: str):
        return _NULL if self.inner is None else self.inner.phase(layer, name)

    def routed(self, layer: int, route, permute, block_m: int) -> None:
        ids = route.topk_ids  # [T, K]
        self.counts.verify += int(torch.unique(ids[self.decode_rows]).numel())
        self.counts.plain += int(torch.unique(ids[self.plain_rows]).numel())
        self.counts.layers += 1
        if self.inner is not None:
            self.inner.routed(layer, route, permute, block_m)

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        if self.inner is not None:
            self.inner.moved(layer, dispatch_bytes, combine_bytes)


COUNTERS = ("verify_steps", "verified", "draft_tokens", "accepted_tokens", "experts_verify", "experts_plain",
            "expert_layers")


def speculative_counters(stats, experts: VerifyExperts | None) -> dict[str, int]:
    """The engine's speculative-decoding counters since it started (EngineStats + VerifyExperts)."""
    ex = experts or VerifyExperts()
    return {"verify_steps": stats.verify_steps, "verified": stats.verified, "draft_tokens": stats.draft_tokens,
            "accepted_tokens": stats.accepted_tokens, "experts_verify": ex.verify, "experts_plain": ex.plain,
            "expert_layers": ex.layers}


def speculative_summary(speculative: str | None, counts: dict[str, int], expert_bytes: float) -> dict:
    """Counters over a window (e.g. a profile's measured steps) → the figures reports show."""
    if speculative is None:
        return {"enabled": False}
    c, layers = counts, counts["expert_layers"]
    per_step = c["expert_layers"] / c["verify_steps"] if c["verify_steps"] else 0  # MoE layers per step
    ev = c["experts_verify"] / layers if layers else 0.0
    ep = c["experts_plain"] / layers if layers else 0.0
    return {"enabled": True, "method": speculative, **c,
            "acceptance_rate": c["accepted_tokens"] / c["draft_tokens"] if c["draft_tokens"] else 0.0,
            "tokens_per_verify": (c["accepted_tokens"] + c["verified"]) / c["verified"] if c["verified"] else 0.0,
            "experts_per_layer_verify": ev, "experts_per_layer_plain": ep,
            "expert_bytes_per_step_verify": ev * per_step * expert_bytes,
            "expert_bytes_per_step_plain": ep * per_step * expert_bytes}
