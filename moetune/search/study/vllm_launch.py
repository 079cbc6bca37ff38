"""vLLM's launch of a search winner (flags as in vLLM's parser, flag_tables/vllm.json).

| moetune knob | vLLM | as priced? |
|---|---|---|
| ep_size R, G = max(tp, expert_tp) | `-tp G`, `-dp R`, `--enable-expert-parallel` (R > 1) | attention TP G × DP R as priced; vLLM spreads experts over all R·G ranks (EP) — expert TP inside an EP group has no flag |
| replicas | `-dp replicas` when R = 1 (vLLM's own load balancer); else one instance per replica | yes |
| max_num_seqs, max_num_batched_tokens | `--max-num-seqs`, `--max-num-batched-tokens` (per DP rank) | yes |
| redundant_experts, eplb | `--enable-eplb --eplb-config '{"num_redundant_experts": N}'` | vLLM rebalances from live load |
| round_robin | `--expert-placement-strategy round_robin` only for models with expert groups, N = 0, no EPLB, on the DeepEP low-latency all-to-all (else vLLM falls back to linear: re-priced contiguous) | where honoured |
| quant fp8, dense_format fp8 | `--quantization fp8` (online, or an fp8 checkpoint as stored: dense layers and every expert) | re-priced with both fp8 |
| kv_format, overlap, cuda_graph_max_bs | `--kv-cache-dtype fp8`, `--enable-dbo`, `--enforce-eager` / `--max-cudagraph-capture-size` (engine_knobs.py) | yes |
| quant int8 | `--quantization experts_int8` (online, every expert) | hot fraction > 0 re-priced as 0 |
| quant int4, offload | no flag for a full-precision checkpoint | re-priced without |
| capacity drop / buffer, affinity scheduling, offload hints | no flag (dropless MoE, arrival-order admission) | re-priced without |
| engine.speculative (recipe) | `--speculative-config '{...}'` (speculative_launch.py) | priced by moetune's simulator (cost/speculative.py) |
| multi-node | head: `-dpl`, `-dpa $HEAD_IP`, `-dpp`; others: `--headless -dpr` | — |
| all-to-all | `--all2all-backend deepep_high_throughput` across nodes | — |
| deploy.attn_dp > 0 (a general mesh) | `-tp`, `-dp`, `--enable-expert-parallel`, `--all2all-backend` (mesh_launch.py) | experts EP × TP both > 1: re-priced EP over all GPUs |
"""

from __future__ import annotations

from moetune.search.cost.deployment import Deployment
from moetune.search.study.engine_knobs import engine_knobs, fp8_as_run, fp8_weights, knobs_as_run
from moetune.search.study.launch import Launch, ServeTarget, as_engine_runs, moetune_only, nodes_of
from moetune.search.study.mesh_launch import vllm_mesh
from moetune.search.study.speculative_launch import describe, vllm_speculative

RPC_PORT = 13345


def vllm_launch(d: Deployment, t: ServeTarget) -> Launch:
    G, R = max(d.tp_size, d.expert_tp_size), d.ep_size
    common = [t.model_id, "--max-num-seqs", str(d.max_num_seqs), "--max-num-batched-tokens",
              str(d.max_num_batched_tokens)]
    unsupported, notes = [], []
    n_nodes = nodes_of(d, t)
    mesh = vllm_mesh(d, n_nodes > 1) if d.attn_dp else None  # a general mesh (mesh_launch.py)
    if mesh is not None:
        common += mesh.flags
        unsupported += mesh.unsupported
        notes += mesh.notes
    elif G > 1:
        common += ["--tensor-parallel-size", str(G)]
        if d.expert_tp_size > 1 and R > 1:
            notes.append(f"expert TP {G} inside each of {R} EP groups has no vLLM flag: vLLM spreads the "
                         f"experts over all {R * G} ranks by expert parallelism (not re-priced)")
        elif d.tp_size > 1 and d.expert_tp_size == 1 and R == 1:
            notes.append("vLLM splits the experts by TP too (moetune priced them whole on each TP rank)")
    backend, placement = _placement(d, t, n_nodes, unsupported, notes)
    if R > 1 and mesh is None:
        common += ["--data-parallel-size", str(R), "--enable-expert-parallel"]
        if backend:
            common += ["--all2all-backend", backend]
    if d.redundant_experts or (R > 1 and d.placement == "eplb"):
        common += ["--enable-eplb", "--eplb-config", f'{{"num_redundant_experts": {d.redundant_experts}}}']
        notes.append("vLLM's EPLB rebalances from live load; it does not read moetune's placement file")
    if placement == "round_robin":
        common += ["--expert-placement-strategy", "round_robin"]
    quant = _quant(d, common, unsupported, notes)
    unsupported += moetune_only(d, "vLLM")
    knobs = engine_knobs(d, "vllm")
    common += knobs.flags
    notes += knobs.notes
    ran = mesh.as_run if mesh is not None and mesh.as_run is not None else d
    as_run = knobs_as_run(d, fp8_as_run(d, as_engine_runs(ran, placement, quant)), knobs)
    if d.offload_resident_fraction < 1:
        unsupported.append("expert offloading with prefetch (vLLM's --cpu-offload-gb offloads whole weights)")
    instances = d.replicas
    if d.replicas > 1 and R == 1 and mesh is None:
        common += ["--data-parallel-size", str(d.replicas)]
        instances = 1
        notes.append(f"replicas: vLLM's data parallelism, {d.replicas} engines behind its own load balancer")
    spec = vllm_speculative(t.speculative)
    common += spec.flags
    dp = d.attn_dp if mesh is not None else R  # vLLM's data-parallel ranks
    nodes = _per_node(common, dp, n_nodes) if dp > 1 and n_nodes > 1 else [common]
    if dp == 1 and n_nodes > 1:
        nodes = _tp_nodes(common, n_nodes)
    return Launch("vllm", nodes, as_run, unsupported, notes + spec.notes, instances,
                  describe(t.speculative) if t.speculative else None, spec.gaps)


def _placement(d: Deployment, t: ServeTarget, n_nodes: int, unsupported: list, notes: list) -> tuple[str | None, str]:
    """The all-to-all backend and the placement vLLM will honour."""
    backend = "deepep_high_throughput" if d.ep_size > 1 and n_nodes > 1 else None
    if d.placement != "round_robin" or d.ep_size == 1:
        return backend, d.placement
    if t.expert_groups > 1 and not d.redundant_experts:
        notes.append("round-robin placement: vLLM honours it on the DeepEP low-latency all-to-all only")
        return "deepep_low_latency", "round_robin"
    unsupported.append("round-robin placement (vLLM honours it only for models with expert groups and no "
                       "redundant experts; it falls back to linear: re-priced contiguous)")
    return backend, "contiguous"


def _quant(d: Deployment, flags: list, unsupported: list, notes: list) -> bool:
    """Adds the quantization flag; False when the low-bit experts cannot be deployed (re-priced without)."""
    low = d.quant_low_format
    if low in ("none", "fp8") and fp8_weights(d):
        flags += ["--quantization", "fp8"]
        notes.append("--quantization fp8 (online from a bf16 checkpoint; an fp8 checkpoint is read as stored) "
                     "quantizes the dense layers and every expert: re-priced with both fp8")
    elif d.dense_format == "fp8":
        unsupported.append(f"fp8 dense weights beside {low} experts (one --quantization: re-priced bf16 dense)")
    if low == "none":
        return True
    if low == "int8":
        flags += ["--quantization", "experts_int8"]
        notes.append("--quantization experts_int8: online int8 weights for every expert")
    elif low != "fp8":
        unsupported.append(f"{low} experts (vLLM needs a pre-quantized GPTQ/AWQ checkpoint for int4)")
        return False
    if d.quant_hot_fraction > 0:
        unsupported.append(f"hot experts kept in full precision ({d.quant_hot_fraction:g}): vLLM quantizes every "
                           "expert (re-priced with hot fraction 0)")
    return True


def _per_node(common: list[str], R: int, n_nodes: int) -> list[list[str]]:
    """vLLM's multi-node data parallelism: the head runs the API server and its local DP ranks."""
    local = max(1, R // n_nodes)
    head = common + ["--data-parallel-size-local", str(local), "--data-parallel-address", "$HEAD_IP",
                     "--data-parallel-rpc-port", str(RPC_PORT)]
    rest = [common + ["--data-parallel-size-local", str(local), "--data-parallel-address", "$HEAD_IP",
                      "--data-parallel-rpc-port", str(RPC_PORT), "--data-parallel-start-rank", str(k * local),
                      "--headless"] for k in range(1, n_nodes)]
    return [head, *rest]


def _tp_nodes(common: list[str], n_nodes: int) -> list[list[str]]:
    """One tensor-parallel group across nodes: vLLM's multiprocessing launcher with a rendezvous."""
    return [common + ["--nnodes", str(n_nodes), "--node-rank", str(k), "--master-addr", "$HEAD_IP"]
            + (["--headless"] if k else []) for k in range(n_nodes)]

