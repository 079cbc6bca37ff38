"""A deployment in the serving engines' words, for tables a person reads: "EP 8, 16 redundant experts,
EPLB placement, max 8 seqs, max 512 batched tokens, fp8 experts/dense/KV, CUDA graphs ≤ 512".
Knobs at their neutral values are left out; `winner.yaml` carries every knob (study/emit.py).
`Deployment.label()` stays the compact key of trials.csv."""

from __future__ import annotations

from moetune.search.cost.deployment import Deployment

PLACEMENTS = {"eplb": "EPLB placement", "contiguous": "contiguous placement", "round_robin": "round-robin placement"}


def describe(d: Deployment) -> str:
    parts = [_parallel(d)]
    if d.redundant_experts:
        parts.append(f"{d.redundant_experts} redundant experts")
    if d.ep_size > 1:
        parts.append(PLACEMENTS.get(d.placement, f"placement {d.placement}"))
    parts += [f"max {d.max_num_seqs} seqs", f"max {d.max_num_batched_tokens} batched tokens"]
    parts += _precision(d) + _offload(d) + _engine(d)
    text = ", ".join(p for p in parts if p)
    if d.prefill_workers:  # disaggregated (cost/disagg.py): the decode worker is the rest of the text
        text = (f"{d.prefill_workers} prefill workers (EP {d.prefill_ep}, TP {d.prefill_tp}, expert TP "
                f"{d.prefill_expert_tp}, max {d.prefill_tokens} batched tokens) + {d.decode_workers} decode workers ({text})")
    return f"{d.replicas} replicas × ({text})" if d.replicas > 1 else text


def _parallel(d: Deployment) -> str:
    if d.attn_dp:  # a general mesh (cost/mesh.py)
        how = "all-to-all" if d.moe_a2a and d.ep_size > 1 else "all-gather"
        return (f"attention DP {d.attn_dp} × TP {d.tp_size}, experts EP {d.ep_size} × TP {d.expert_tp_size} "
                f"({how})")
    out = f"EP {d.ep_size}"
    if d.tp_size > 1:
        out += f", TP {d.tp_size}"
    if d.expert_tp_size != d.tp_size:
        out += f", expert TP {d.expert_tp_size}"
    return out


def _precision(d: Deployment) -> list[str]:
    """Formats named once each, the parts in that format after it: "fp8 experts/dense/KV"."""
    held: dict[str, list[str]] = {}
    if d.quant_low_format != "none":
        held.setdefault(d.quant_low_format, []).append("experts")
    if d.dense_format != "none":
        held.setdefault(d.dense_format, []).append("dense")
    if d.kv_format != "none":
        held.setdefault(d.kv_format, []).append("KV")
    out = [f"{fmt} {'/'.join(parts)}" for fmt, parts in held.items()]
    if d.quant_low_format != "none" and d.quant_hot_fraction > 0:
        out.append(f"{d.quant_hot_fraction:.0%} hottest experts full precision")
    return out


def _offload(d: Deployment) -> list[str]:
    if d.offload_resident_fraction >= 1:
        return []
    out = [f"{d.offload_resident_fraction:.0%} of experts resident",
           f"prefetch {d.offload_prefetch_depth} layers ahead" if d.offload_prefetch_depth else "no prefetch",
           f"{d.offload_eviction.upper()} eviction"]
    if d.offload_hints != "router":
        out.append(f"prefetch hints from {d.offload_hints}")
    return out


def _engine(d: Deployment) -> list[str]:
    out = []
    if d.capacity_policy != "none":
        out.append(f"capacity factor {d.capacity_factor:g} ({d.capacity_policy})")
    if d.scheduling != "fcfs":
        out.append(f"{d.scheduling} scheduling")
    if d.speculative != "none":
        out.append(f"speculative {d.speculative}")
    if d.overlap:
        out.append("two-batch overlap")
    if d.cuda_graph_max_bs > 0:
        out.append(f"CUDA graphs ≤ {d.cuda_graph_max_bs}")
    elif d.cuda_graph_max_bs == 0:
        out.append("eager (no CUDA graphs)")
    return out
