"""Per-rank memory of a deployment, estimated before anything runs (the memory pruning rule).

rank bytes = dense weights (every rank: data-parallel attention): the projections at the dense format
             (precision.py), embedding / LM head / routers at the model dtype
           + resident expert slots (P/R per rank, × resident fraction when offloading) at their formats
           + KV cache: min(max_num_seqs, requests on the rank) × (prompt + output) × L × kv elements × KV bytes
           + activations: max_num_batched_tokens · b · (4·D + E + K·(2·D + 3·I))   (profile/memory.py)
           + logits: max_num_seqs · V · 4
Fits when it is at most 90 % of the rank's memory (on `this-machine`, R ranks share the host's
available RAM).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moetune.search.cost.hardware import Hardware
from moetune.search.cost.precision import Precision
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simmodel import SimModel
from moetune.search.cost.deployment import Deployment

HEADROOM = 0.9


@dataclass(frozen=True)
class RankMemory:
    dense: float
    experts: float
    kv: float
    activations: float

    @property
    def total(self) -> float:
        return self.dense + self.experts + self.kv + self.activations

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def rank_memory(m: SimModel, d: Deployment, w: SimWorkload, b: int, mean_expert_bytes: float,
                prec: Precision | None = None) -> RankMemory:
    prec = prec or Precision.plain(b)
    R = d.ep_size
    slots = (m.E + d.redundant_experts) // R
    resident = slots * d.offload_resident_fraction
    seqs = min(d.max_num_seqs, -(-w.num_requests // R))
    max_len = max(w.prompt_lens) + w.output_len
    kv = seqs * max_len * m.L * m.kv_elems * prec.kv_b
    act = d.max_num_batched_tokens * b * (4 * m.D + m.E + m.K * (2 * m.D + 3 * m.I)) + d.max_num_seqs * m.V * 4
    proj = m.dense_projections()
    dense = proj * prec.dense_b + (m.dense_weights() - proj) * b
    return RankMemory(dense, m.Lm * resident * mean_expert_bytes, kv, act)


def memory_reason(mem: RankMemory, hw: Hardware, ranks: int) -> str | None:
    """Why it does not fit, or None."""
    shared = hw.name == "this-machine"
    need = mem.total * (ranks if shared else 1)
    have = hw.mem_bytes * HEADROOM
    if need <= have:
        return None
    where = f"{ranks} ranks on this machine" if shared else "per rank"
    return (f"needs {need / 1e9:.1f} GB {where} (weights {mem.dense / 1e9:.1f} + experts {mem.experts / 1e9:.1f} "
            f"+ KV {mem.kv / 1e9:.1f} + activations {mem.activations / 1e9:.1f}) > {have / 1e9:.1f} GB usable")
