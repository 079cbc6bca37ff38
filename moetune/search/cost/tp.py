"""Tensor parallelism in the simulator: the shapes one rank computes and the collectives the engine runs.

A deployment with tensor-parallel groups of G ranks (docs/architecture.md §3d) is priced on the
rank's own shapes (`tp_model`: attention weights and per-pair FLOPs / tp_size, GQA's KV cache
/ min(tp_size, Hkv) heads while MLA's latent stays whole, dense MLPs and the LM head / tp_size,
expert and shared-expert intermediate / expert_tp_size), plus exactly the collectives the engine
runs per step, on the T tokens of the largest DP group (the lock-step waits for it):

  all-reduce(x [T, D])  = 2·(G−1)/G · T·D·b / (link B/s · link_eff) + α_ar     (ring: reduce-scatter + all-gather)
  tp_allreduce          = (L if tp_size > 1) + (dense layers if tp_size > 1) + (MoE layers if expert_tp_size > 1)
                          all-reduces of [T, D], plus with a q/k norm over the whole projection (olmoe,
                          tp_size > 1) L all-reduces of the [T, 2] sums of squares (model/tp_norm.py)
  tp_embed              = one all-reduce of [T, D]                                (tp_size > 1)
  tp_gather             = (G−1)/G · S·V·b / (link B/s · link_eff) + α_ar          (tp_size > 1; S rows sample)

α_ar is the measured latency of a small gloo all-reduce among G local ranks on `this-machine`
(`allreduce_latency`, measured once per simulator), else the hardware's intra-node latency. On
`this-machine` calibrated on microbenchmarks, a TP group has its own path (calibrate.tp_rates, cached
as `tp/G<g>`): the engine's group on G one-thread processes, whose measured seconds per all-reduce and
per gather at the measured payloads give the link B/s (the slope between decode's small and
prefill's large all-reduce) and α (each payload's bandwidth term taken off: the measured sizes are
reproduced exactly) and whose step minus collectives, over the one-rank probed step, is the
compute factor applied to the whole model's one-rank price (simulate.py `own_path`).
"""

from __future__ import annotations

import dataclasses
import time

from moetune.search.cost.simmodel import SimModel

TP_PHASES = ("tp_allreduce", "tp_embed", "tp_gather")


def group_size(d) -> int:
    return max(d.tp_size, d.expert_tp_size)


def tp_reason(m: SimModel, d) -> str | None:
    """Why the engine cannot split this model as `d` says (model/tp_check.py's rules, on the simulator's
    sizes), or None."""
    tp, etp, G = d.tp_size, d.expert_tp_size, group_size(d)
    if G == 1:
        return None
    if tp not in (1, G) or etp not in (1, G):
        return f"tp_size {tp} and expert_tp_size {etp} must each be 1 or the group size {G}"
    sizes = []  # (knob, its size, a size it must divide, what that is)
    if tp > 1:
        sizes += [("tp_size", tp, m.heads, "attention heads"), ("tp_size", tp, m.V, "vocabulary")]
        sizes += [("tp_size", tp, i, "dense intermediate size") for i in m.dense_I]
        if m.kv_heads and m.kv_heads % tp and tp % m.kv_heads:
            return f"tp_size {tp} neither divides nor is a multiple of the {m.kv_heads} KV heads"
    if etp > 1:
        sizes += [("expert_tp_size", etp, m.I, "expert intermediate size"),
                  ("expert_tp_size", etp, m.I_shared, "shared expert intermediate size")]
    for knob, g, n, what in sizes:
        if n and n % g:
            return f"{knob} {g} does not divide the {what} ({n})"
    return None


def tp_model(m: SimModel, d) -> SimModel:
    """The shapes one rank of a TP group computes (the model itself without TP)."""
    tp, etp = d.tp_size, d.expert_tp_size
    if tp == 1 and etp == 1:
        return m
    out = m
    if tp > 1:
        kv = m.kv_elems if m.kv_heads == 0 else m.kv_elems * max(1, m.kv_heads // tp) // m.kv_heads
        out = dataclasses.replace(out, attn_weights=m.attn_weights // tp, pair_flops=m.pair_flops // tp, kv_elems=kv,
                                  dense_I=tuple(i // tp for i in m.dense_I), V=m.V // tp)
    if etp > 1:
        out = dataclasses.replace(out, I=m.I // etp, I_shared=m.I_shared // etp)
    return out


def tp_collectives(m: SimModel, d, tokens: float, sampled: float, bw: float, latency: float,
                   act_bytes: int, gather_latency: float | None = None) -> dict[str, float]:
    """Seconds of each TP collective phase in one step (zeros without TP). m: the full model.
    gather_latency: the LM head gather's own α (this-machine's TP microbenchmark), else `latency`."""
    G = group_size(d)
    if G == 1 or tokens <= 0:
        return dict.fromkeys(TP_PHASES, 0.0)
    ring = 2 * (G - 1) / G
    one = ring * tokens * m.D * act_bytes / bw + latency  # all-reduce of [T, D]
    count = (m.L + len(m.dense_I) if d.tp_size > 1 else 0) + (m.Lm if d.expert_tp_size > 1 else 0)
    norms = m.L * (ring * tokens * 2 * 4 / bw + latency) if d.tp_size > 1 and m.whole_qk_norm else 0.0  # fp32 sums
    g_lat = latency if gather_latency is None else gather_latency
    gather = ((G - 1) / G * sampled * m.V * act_bytes / bw + g_lat) if d.tp_size > 1 and sampled > 0 else 0.0
    return {"tp_allreduce": count * one + norms, "tp_embed": one if d.tp_size > 1 else 0.0, "tp_gather": gather}


def allreduce_latency(ranks: int, rounds: int = 200) -> float:
    """Seconds per small all-reduce among `ranks` local gloo processes (one-thread CPU ranks, spawned
    by the engine's launcher, as the engine's TP groups run here)."""
    import torch

    from moetune.engine.ep_launch import launch

    return float(launch(_AllReduceJob(rounds), ranks, torch.device("cpu"), 60.0))


class _AllReduceJob:
    """Picklable: every rank all-reduces a few floats `rounds` times; rank 0 returns s / all-reduce."""

    def __init__(self, rounds: int):
        self.rounds = rounds

    def __call__(self, ctx) -> float:
        import torch
        import torch.distributed as dist

        x = torch.ones(64)
        for _ in range(10):
            dist.all_reduce(x)
        start = time.perf_counter()
        for _ in range(self.rounds):
            dist.all_reduce(x)
        return (time.perf_counter() - start) / self.rounds
