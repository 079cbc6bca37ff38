"""A sampled point the engine cannot run as asked, repaired to the nearest point that runs, so
that the study spends its trials on deployments rather than on pruned combinations (most of the
default grid's (ep_size, redundant_experts, replicas) triples do not tile the GPUs):

- redundant slots N rounded up until the E + N slots tile the R ranks ((E + N) % R = 0);
- replicas > 1 are copies filling the GPUs: GPUs / (R·G) of them (one when R·G does not divide them);
- offloading at R > 1 (the engine offloads on one rank only): every expert resident.

A repaired trial says what it ran and why (the trial's `same_as` note, trials.csv `deployment`),
and reuses the result of an earlier trial of the same deployment, like a canonical twin.
"""

from __future__ import annotations

from dataclasses import replace

from moetune.search.cost.deployment import Deployment


def repair(d: Deployment, num_experts: int, gpus: int) -> tuple[Deployment, list[str]]:
    out, notes = d, []
    R = d.ep_size
    if R > gpus:
        return d, notes  # no repair: pruned (more ranks than the hardware has)
    if (num_experts + d.redundant_experts) % R:
        n = d.redundant_experts + (-(num_experts + d.redundant_experts)) % R
        out = replace(out, redundant_experts=n)
        notes.append(f"redundant_experts {d.redundant_experts} → {n} (the {num_experts} + N slots tile {R} ranks)")
    W = R * max(d.tp_size, d.expert_tp_size)
    if d.replicas > 1 and d.replicas * W != gpus:
        n = gpus // W if gpus % W == 0 else 1
        out = replace(out, replicas=n)
        notes.append(f"replicas {d.replicas} → {n} (copies fill the {gpus} GPUs, {W} each)")
    if R > 1 and d.offload_resident_fraction < 1:
        out = replace(out, offload_resident_fraction=1.0, offload_prefetch_depth=0, offload_eviction="lru")
        notes.append(f"offloading at ep_size {R} → every expert resident (the engine offloads on one rank)")
    return out, notes
