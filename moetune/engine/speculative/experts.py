"""What a verify step costs an MoE model: the distinct experts each MoE layer computes for the
step's decode rows (every sequence's last token and its draft tokens) against the experts the
same step would have woken as a plain decode (the last tokens alone: the same tokens at the same
positions, so the same routing). Draft tokens of different sequences route to different experts,
so a verify step at batch B reads more expert weights than a decode at batch B; at batch 1 the
draft tokens mostly share the one sequence's experts.

Counted only on verify steps, by a routing probe put in front of the model's own probe (the
profiler's, the server's window) for the forward and taken away after; prefill rows of a mixed
step are left out of both counts.

A drafter with experts of its own (an MTP module whose block is an MoE layer) reads expert weights
that plain decoding never reads: every forward of its block (after each target step, and each
chained draft position) counts the distinct experts of all its rows (`draft`, `draft_layers`)
and their bytes (`draft_bytes`, the drafter's own per-expert size: an MTP block's experts load in
plain precision), added to the verify side of the comparison per verify step (`speculative_summary`).
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
        self.draft = 0  # Σ over the drafter's MoE forwards (MTP block): distinct experts of their rows
        self.draft_layers = 0  # the drafter's MoE forwards counted
        self.draft_bytes = 0  # Σ likewise: their expert weight bytes

    def watch_drafter(self, moe_layer, expert_bytes: int) -> None:
        """Count the experts the drafter's MoE layer (an MTP block's, `expert_bytes` per expert) wakes
        on every forward."""
        moe_layer.probe = _DraftWatch(self, expert_bytes)

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


class _DraftWatch:
    """The drafter's MoE layer probe: distinct experts per forward (no phases timed)."""

    times_phases = False

    def __init__(self, counts: VerifyExperts, expert_bytes: int):
        self.counts, self.expert_bytes = counts, expert_bytes

    def phase(self, layer: int, name: str):
        return _NULL

    def routed(self, layer: int, route, permute, block_m: int) -> None:
        woken = int(torch.unique(route.topk_ids).numel())
        self.counts.draft += woken
        self.counts.draft_layers += 1
        self.counts.draft_bytes += woken * self.expert_bytes

    def moved(self, layer: int, dispatch_bytes: int, combine_bytes: int) -> None:
        pass


COUNTERS = ("verify_steps", "verified", "draft_tokens", "accepted_tokens", "experts_verify", "experts_plain",
            "expert_layers", "experts_draft", "draft_expert_layers", "draft_expert_bytes")


def speculative_counters(stats, experts: VerifyExperts | None) -> dict[str, int]:
    """The engine's speculative-decoding counters since it started (EngineStats + VerifyExperts)."""
    ex = experts or VerifyExperts()
    return {"verify_steps": stats.verify_steps, "verified": stats.verified, "draft_tokens": stats.draft_tokens,
            "accepted_tokens": stats.accepted_tokens, "experts_verify": ex.verify, "experts_plain": ex.plain,
            "expert_layers": ex.layers, "experts_draft": ex.draft, "draft_expert_layers": ex.draft_layers,
            "draft_expert_bytes": ex.draft_bytes}


def speculative_summary(speculative: str | None, counts: dict[str, int], expert_bytes: float) -> dict:
    """Counters over a window (e.g. a profile's measured steps) → the figures reports show
    (expert_bytes: one target expert's weight bytes). The verify side's bytes per step include the
    drafter's expert reads over the window, per verify step."""
    if speculative is None:
        return {"enabled": False}
    c, layers, steps = counts, counts["expert_layers"], counts["verify_steps"]
    per_step = c["expert_layers"] / steps if steps else 0  # MoE layers per step
    ev = c["experts_verify"] / layers if layers else 0.0
    ep = c["experts_plain"] / layers if layers else 0.0
    draft = c["experts_draft"] / steps if steps else 0.0  # the drafter's experts read per verify step
    draft_bytes = c["draft_expert_bytes"] / steps if steps else 0.0
    return {"enabled": True, "method": speculative, **c,
            "acceptance_rate": c["accepted_tokens"] / c["draft_tokens"] if c["draft_tokens"] else 0.0,
            "tokens_per_verify": (c["accepted_tokens"] + c["verified"]) / c["verified"] if c["verified"] else 0.0,
            "experts_per_layer_verify": ev, "experts_per_layer_plain": ep, "draft_experts_per_step": draft,
            "expert_bytes_per_step_draft": draft_bytes,
            "expert_bytes_per_step_verify": ev * per_step * expert_bytes + draft_bytes,
            "expert_bytes_per_step_plain": ep * per_step * expert_bytes}
