"""Reference deployments that a study runs first (Optuna `enqueue_trial`): the shapes real clusters
serve, derived from the hardware (GPUs, GPUs per node), the model (experts, sizes: the memory
estimate, the TP divisibility rules) and the space (only values its domains hold), so that a small
trial budget starts from points a cluster engineer would try by hand instead of from random ones.

| seed | what it is |
|---|---|
| `replicas` | the most replicas at the smallest EP group (no TP, dividing the GPUs) that fits memory: the data-parallel shape (left out when that group is a node's or wider: the EP seeds below) |
| `replicas-own-experts` | the same with the experts in the checkpoint's own format (fp8 experts are not always faster: vLLM 0.24.0's measured per-tensor fp8 fused MoE at EP 1 on Qwen3-30B-A3B's shapes is ~3× its bf16 one at 64-1,024 tokens) |
| `ep-node` | EP over one node's GPUs (a replica per node), EPLB placement with ~E/8 redundant slots, 512 tokens per step (short prefill chunks keep TPOT low) |
| `wide-ep` | EP over every GPU (one replica), EPLB, ~E/8 redundant slots, 256 tokens per step (one node: EP over its GPUs at the shorter chunk) |
| `dp-attention` | attention data-parallel over one node's GPUs with every expert TP-split over them (all-gather dispatch, `deploy.attn_dp`): vLLM's `--data-parallel-size` without expert parallelism, the mesh measured tables favour for DeepSeek-V3 (only where the space searches attn_dp and expert_tp_size); `dp-attention-G`: the same mesh over G < a node's GPUs with replicas filling the rest (each G dividing the GPUs, kept where it fits memory: the peer's Mixtral pick, 2 × DP-4 × TP-4) |
| `disagg-dp-attention` | disaggregated prefill/decode over two nodes: one prefill worker and one decode worker, each attention DP over a node's GPUs × experts TP over it (the peer's DeepSeek-V3 pick on 16 H200), replicas filling the rest; the decode worker holding the requests of both workers' GPUs (`load_per_gpu`: when the load is found per trial, the same requests per GPU as the node-wide `dp-attention` seed; its prefill moved to the other node, the decode worker has the room). Only where the space searches the disaggregated form (2+ nodes) with those worker meshes |
| `tp` | attention, dense and expert weights split over the smallest TP group the heads allow that fits, replicas filling the GPUs (only where --space searches tp_size) |

Every seed prefers fp8 experts, dense weights and KV cache where the space holds those values, one
decode batch per rank's in-flight requests (`max_num_seqs`), every expert resident, and is kept only
when `prune` passes after `repair` (a seed over memory may still be repaired to fit by the study, as
any sampled point is); seeds that run as the same deployment are kept once.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.search.cost.deployment import Deployment
from moetune.search.study.repair import MemoryRule, repair
from moetune.search.study.space import Limits, Space, canonical, prune


@dataclass(frozen=True)
class Seed:
    name: str
    params: dict  # one value per knob of the space, each from its domain (what `enqueue_trial` fixes)


def reference_seeds(space: Space, lim: Limits, gpus_per_node: int, rule: MemoryRule | None = None,
                    load_per_gpu: bool = False) -> list[Seed]:
    """The reference deployments for this space, hardware and model, in the order the study runs them.
    `load_per_gpu`: lim.requests is a node-wide replica's load (the load is found per trial), so that a
    disaggregated replica over two nodes holds twice it (module doc)."""
    make = _Maker(space, lim, rule)
    node = max((r for r in make.domain("ep_size") if r <= gpus_per_node), default=1)
    wide = max(make.domain("ep_size"))
    tiling = make.tiling("ep_size")  # EP groups whose replicas fill the GPUs
    replicas = make.smallest_fitting(lambda r: make.point(ep_size=r, tokens=2048), tiling)
    replicas = replicas if replicas is not None and replicas["ep_size"] < node else None
    candidates = [("replicas", replicas),
                  ("replicas-own-experts", replicas and {**replicas, "quant_low_format": make.pick("quant_low_format",
                                                                                                   "none")}),
                  ("ep-node", make.ep_point(node, tokens=512)),
                  ("wide-ep", make.ep_point(wide, tokens=256))]
    meshes = [g for g in make.domain("attn_dp") if 1 < g <= node and make.lim.max_ranks % g == 0
              and g in make.domain("expert_tp_size")]
    for g in sorted(meshes, reverse=True):  # the node-wide mesh first, then narrower ones with replicas
        point = make.mesh_point(g)
        if g == node or make.fits(point):
            candidates.append(("dp-attention" if g == node else f"dp-attention-{g}", point))
    disagg = make.disagg_point(node, load_per_gpu)
    if disagg is not None and make.fits(disagg):
        candidates.append(("disagg-dp-attention", disagg))
    if any(g > 1 for g in make.domain("tp_size")):
        groups = [g for g in make.tiling("tp_size") if g > 1]
        candidates.append(("tp", make.smallest_fitting(lambda g: make.point(tp_size=g, tokens=2048), groups)))
    out, seen = [], set()
    for name, params in candidates:
        if params is None:
            continue
        key = make.ran_as(params)
        if key is not None and key not in seen:
            seen.add(key)
            out.append(Seed(name, params))
    return out


class _Maker:
    """Builds seed points from the space's domains."""

    def __init__(self, space: Space, lim: Limits, rule: MemoryRule | None):
        self.space, self.lim, self.rule = space, lim, rule
        self.domains = {k.name: k.values for k in space.knobs}

    def domain(self, name: str) -> tuple:
        return self.domains.get(name, (getattr(Deployment(), name),))

    def pick(self, name: str, *prefs):
        """The first preferred value the knob's domain holds, else its default (or first) value."""
        values = self.domain(name)
        for p in prefs:
            if p in values:
                return p
        default = getattr(Deployment(), name)
        return default if default in values else values[0]

    def point(self, ep_size: int = 1, tp_size: int = 1, tokens: int = 2048, eplb: bool = False) -> dict:
        """A seed's params: every knob of the space at a value of its domain."""
        E, gpus = self.lim.num_experts, self.lim.max_ranks
        tp, etp = self.pick("tp_size", tp_size), self.pick("expert_tp_size", tp_size)
        group = ep_size * max(tp, etp)
        replicas = self.pick("replicas", gpus // group, 1)
        per_replica = self.lim.requests if self.lim.per_replica else -(-self.lim.requests // replicas)
        per_rank = -(-per_replica // ep_size)  # a TP group's ranks hold the same requests
        seqs = self.seqs_holding(per_rank)
        redundant = sorted((v for v in self.domain("redundant_experts") if v > 0), key=lambda v: abs(v - E / 8))
        values = {
            "ep_size": self.pick("ep_size", ep_size), "tp_size": tp, "expert_tp_size": etp, "replicas": replicas,
            "placement": self.pick("placement", "eplb", "round_robin") if eplb and ep_size > 1 else
            self.pick("placement", "contiguous"),
            "redundant_experts": self.pick("redundant_experts", *(redundant if eplb and ep_size > 1 else ()), 0),
            "max_num_seqs": seqs,
            "max_num_batched_tokens": self.pick("max_num_batched_tokens", *sorted(
                v for v in self.domain("max_num_batched_tokens") if v >= max(tokens, seqs))),
            "quant_low_format": self.pick("quant_low_format", "fp8", "none"),
            "quant_hot_fraction": self.pick("quant_hot_fraction", 0.0),
            "offload_resident_fraction": self.pick("offload_resident_fraction", 1.0),
            "dense_format": self.pick("dense_format", "fp8"), "kv_format": self.pick("kv_format", "fp8"),
        }
        return {name: values[name] if name in values else self.pick(name) for name in self.domains}

    def mesh_point(self, group: int) -> dict:
        """Attention DP over `group` GPUs, the experts TP-split over the same GPUs (module doc), each DP rank
        holding its share of the replica's requests."""
        p = self.point(tp_size=group, tokens=2048)
        per_replica = self.lim.requests if self.lim.per_replica else -(-self.lim.requests // p["replicas"])
        mesh = {"attn_dp": group, "moe_a2a": 0, "tp_size": self.pick("tp_size", 1), "expert_tp_size": group,
                "max_num_seqs": self.seqs_holding(-(-per_replica // group))}
        return {**p, **{k: v for k, v in mesh.items() if k in self.domains}}

    def disagg_point(self, group: int, load_per_gpu: bool) -> dict | None:
        """One prefill and one decode worker, each attention DP over `group` GPUs × experts TP over them, replicas
        filling the GPUs (module doc); None where the space holds no such point."""
        workers = {"prefill_workers": 1, "decode_workers": 1, "prefill_ep": 1, "prefill_tp": 1,
                   "prefill_expert_tp": group}
        if any(v not in self.domain(k) for k, v in workers.items()) or group < 2 or self.lim.max_ranks % (2 * group) \
                or group not in self.domain("attn_dp") or group not in self.domain("expert_tp_size"):
            return None
        replicas = self.pick("replicas", self.lim.max_ranks // (2 * group), 1)
        per_replica = self.lim.requests if self.lim.per_replica else -(-self.lim.requests // replicas)
        per_replica *= 2 if load_per_gpu else 1  # the decode worker holds both workers' GPUs' share
        knobs = {**workers, "replicas": replicas, "max_num_seqs": self.seqs_holding(-(-per_replica // group))}
        return {**self.mesh_point(group), **{k: v for k, v in knobs.items() if k in self.domains}}

    def seqs_holding(self, per_rank: int) -> int:
        """The smallest max_num_seqs of the space holding `per_rank` requests (else its largest)."""
        return self.pick("max_num_seqs", *sorted(v for v in self.domain("max_num_seqs") if v >= per_rank),
                         max(self.domain("max_num_seqs")))

    def ep_point(self, ep_size: int, tokens: int) -> dict | None:
        return self.point(ep_size=ep_size, tokens=tokens, eplb=True) if ep_size > 1 else None

    def repaired(self, params: dict) -> Deployment | None:
        """The deployment a seed runs as (repaired, canonical), or None when prune refuses it."""
        d, _ = repair(Deployment(**{**Deployment().as_dict(), **params}), self.lim.num_experts, self.lim.max_ranks,
                      max(self.domain("attn_dp")) > 0)
        if prune(d, self.lim) is not None:
            return None
        return canonical(d, self.lim)[0]

    def ran_as(self, params: dict) -> tuple | None:
        d = self.repaired(params)
        return None if d is None else tuple(sorted(d.as_dict().items()))

    def tiling(self, knob: str) -> list[int]:
        """The knob's values (EP size, TP group) that divide the hardware's GPUs, smallest first."""
        return sorted(v for v in self.domain(knob) if self.lim.max_ranks % v == 0)

    def fits(self, params: dict) -> bool:
        """Whether the seed passes prune and (with a memory rule) fits memory."""
        d = self.repaired(params)
        return d is not None and (self.rule is None or self.rule.reason(d) is None)

    def smallest_fitting(self, make, values: list[int]) -> dict | None:
        """The seed at the smallest of `values` (EP sizes or TP groups) that prune passes and memory fits;
        without a memory rule, or when none fits, the smallest that prune passes."""
        passing = [p for p in (make(v) for v in values) if self.repaired(p) is not None]
        if self.rule is not None:
            fits = [p for p in passing if self.rule.reason(self.repaired(p)) is None]
            if fits:
                return fits[0]
        return passing[0] if passing else None
