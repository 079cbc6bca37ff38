"""Per-rank memory of a deployment, estimated before anything runs (the memory pruning rule).

rank bytes = dense weights (every rank: data-parallel attention): the projections at the dense format
             (precision.py), embedding / LM head / routers at the model dtype
           + resident expert slots (P/R per rank, × resident fraction when offloading) at their formats
           + KV cache: min(max_num_seqs, requests in flight on the rank) × (prompt + output) × L × kv elements
             × KV bytes (in flight: `SimWorkload.most_in_flight` of the workload priced — a trial's figure is at
             the load it was priced at; the memory rule, before pricing, at the most a rank may hold)
           + activations: max_num_batched_tokens · b · (4·D + E + K·(2·D + 3·I))   (profile/memory.py)
           + logits: max_num_seqs · V · 4
           + CUDA graphs (GPU hardware, cuda_graph_max_bs > 0; estimated), n = min(cuda_graph_max_bs,
             max_num_seqs): no engine captures a decode batch larger than the sequences a rank may run
             (SGLang's capture list stops at its request pool, vLLM's at max_num_seqs); the memory SGLang
             reserves for the decode graphs it captures, per GPU, in MB: 2·n, and with data-parallel attention
             (moetune's EP ranks, R > 1) + 3·n·R, + 1.5·n·R more when n > 300 (sglang
             python/sglang/srt/server_args.py `_handle_gpu_memory_settings`, "For cuda graphs", from
             sgl-project/sglang PR 10975; vLLM measures its capture at start-up instead and has no
             constant, so the same figure is used for both engines' launch files)
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
    graphs: float = 0.0  # CUDA-graph capture (module doc; 0 eager or off GPU)

    @property
    def total(self) -> float:
        return self.dense + self.experts + self.kv + self.activations + self.graphs

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def rank_memory(m: SimModel, d: Deployment, w: SimWorkload, b: int, mean_expert_bytes: float,
                prec: Precision | None = None) -> RankMemory:
    prec = prec or Precision.plain(b)
    R = d.ep_size
    slots = (m.E + d.redundant_experts) // R
    resident = slots * d.offload_resident_fraction
    seqs = min(d.max_num_seqs, -(-w.most_in_flight // R))  # at a probe of the load search: its concurrency
    max_len = max(w.prompt_lens) + w.output_len
    kv = seqs * max_len * m.L * m.kv_elems * prec.kv_b
    act = d.max_num_batched_tokens * b * (4 * m.D + m.E + m.K * (2 * m.D + 3 * m.I)) + d.max_num_seqs * m.V * 4
    proj = m.dense_projections()
    dense = proj * prec.dense_b + (m.dense_weights() - proj) * b
    return RankMemory(dense, m.Lm * resident * mean_expert_bytes, kv, act, graph_bytes(d))


GRAPH_MB_PER_BS = 2.0  # SGLang server_args.py: reserved_mem += cuda_graph_max_bs * 2 (MB)
GRAPH_DP_MB_PER_BS = 3.0  # ... with DP attention: += cuda_graph_max_bs * dp_size * 3
GRAPH_DP_LARGE_MB_PER_BS = 1.5  # ... and when cuda_graph_max_bs > 300: += cuda_graph_max_bs * dp_size * 1.5


def graph_bytes(d: Deployment) -> float:
    """Bytes per GPU the decode CUDA graphs of d take (module doc): 0 eager (0) or not priced (−1)."""
    if d.cuda_graph_max_bs <= 0:
        return 0.0
    n = min(d.cuda_graph_max_bs, d.max_num_seqs)  # the largest decode batch captured
    mb = GRAPH_MB_PER_BS * n
    if d.ep_size > 1:  # data-parallel attention over the EP ranks
        mb += GRAPH_DP_MB_PER_BS * n * d.ep_size
        if n > 300:
            mb += GRAPH_DP_LARGE_MB_PER_BS * n * d.ep_size
    return mb * 1024 * 1024


def memory_reason(mem: RankMemory, hw: Hardware, ranks: int) -> str | None:
    """Why it does not fit, or None."""
    shared = hw.name == "this-machine"
    need = mem.total * (ranks if shared else 1)
    have = hw.mem_bytes * HEADROOM
    if need <= have:
        return None
    where = f"{ranks} ranks on this machine" if shared else "per rank"
    return (f"needs {need / 1e9:.1f} GB {where} (weights {mem.dense / 1e9:.1f} + experts {mem.experts / 1e9:.1f} "
            f"+ KV {mem.kv / 1e9:.1f} + activations {mem.activations / 1e9:.1f}"
            + (f" + CUDA graphs {mem.graphs / 1e9:.1f}" if mem.graphs else "") + f") > {have / 1e9:.1f} GB usable")
