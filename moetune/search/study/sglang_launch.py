"""SGLang's launch of a search winner (flags as in SGLang's parser, flag_tables/sglang.json).

| moetune knob | SGLang | as priced? |
|---|---|---|
| ep_size R, G = max(tp, expert_tp) | `--tp-size R·G`, `--ep-size R` (MoE TP = G), `--attn-dp-size R` (attention TP G × DP R) | yes, where the model has DP attention (qwen2/3_moe, deepseek_v2/v3); else attention runs TP over R·G |
| all-to-all | `--moe-a2a-backend deepep` when G = 1 (SGLang's all-to-all backends force ep = tp) | yes; at G > 1 the default dispatcher |
| replicas | `--dp-size replicas` without DP attention; else one instance per replica (SGLang refuses both) | yes |
| max_num_seqs, max_num_batched_tokens | `--max-running-requests`, `--chunked-prefill-size`: per instance (× R under DP attention) | closest (chunked prefill is not a step budget) |
| redundant_experts, placement | `--ep-num-redundant-experts N`, `--init-expert-location FILE` | yes |
| quant fp8, dense_format fp8 | `--quantization fp8` (online, or an fp8 checkpoint as stored: dense layers and every expert) | re-priced with both fp8 |
| kv_format, overlap, cuda_graph_max_bs | `--kv-cache-dtype fp8_e4m3`, `--enable-two-batch-overlap` (DeepEP only), `--disable-decode-cuda-graph` / `--cuda-graph-max-bs-decode` (engine_knobs.py) | yes (overlap at G > 1: re-priced without) |
| quant int8 / int4, offload | no flag for a full-precision checkpoint (w8a8_int8 / moe_wna16 need pre-quantized weights) | re-priced without |
| capacity drop / buffer, affinity scheduling, offload hints | no flag (dropless MoE, arrival-order admission) | re-priced without |
| engine.speculative (recipe) | `--speculative-algorithm NGRAM` / `STANDALONE` with its draft-token flags (speculative_launch.py) | priced by moetune's simulator (cost/speculative.py) |
| deploy.attn_dp > 0 (a general mesh) | `--tp-size N`, `--attn-dp-size a`, `--ep-size e` (MoE TP N / e), `--moe-a2a-backend deepep / none` (mesh_launch.py) | yes, where the model has DP attention |
| multi-node | `--nnodes n --node-rank k --dist-init-addr $HEAD_IP:5000` | — |
"""

from __future__ import annotations

from moetune.search.cost.deployment import Deployment, gpus
from moetune.search.study.engine_knobs import engine_knobs, fp8_as_run, fp8_weights, knobs_as_run
from moetune.search.study.launch import Launch, ServeTarget, as_engine_runs, moetune_only, nodes_of
from moetune.search.study.mesh_launch import sglang_mesh
from moetune.search.study.speculative_launch import describe, sglang_speculative

DP_ATTENTION = ("qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")  # models/*.py with attention-DP groups
DIST_PORT = 5000


def sglang_launch(d: Deployment, t: ServeTarget, location_json: str | None) -> Launch:
    G, R = max(d.tp_size, d.expert_tp_size), d.ep_size
    W, notes, unsupported = R * G, [], []
    attn_dp = R > 1 and t.model_type in DP_ATTENTION
    per = R if attn_dp else 1  # SGLang divides these among its attention-DP groups
    flags = ["--model-path", t.model_id, "--max-running-requests", str(d.max_num_seqs * per),
             "--chunked-prefill-size", str(d.max_num_batched_tokens * per)]
    mesh = sglang_mesh(d, t.model_type in DP_ATTENTION, t.model_type) if d.attn_dp else None  # mesh_launch.py
    if mesh is not None:
        W, attn_dp = gpus(d), d.attn_dp > 1 and t.model_type in DP_ATTENTION
        per = d.attn_dp if attn_dp else 1
        flags[3], flags[5] = str(d.max_num_seqs * per), str(d.max_num_batched_tokens * per)
        flags += mesh.flags
        notes += mesh.notes
        unsupported += mesh.unsupported
    elif W > 1:
        flags += ["--tp-size", str(W)]
    if R > 1 and mesh is None:
        flags += _expert_parallel(d, R, G, notes)
        if attn_dp:
            flags += ["--attn-dp-size", str(R)]
        else:
            notes.append(f"SGLang has no attention-DP groups for {t.model_type}: attention runs TP over {W} GPUs "
                         "(moetune priced DP over the EP groups; not re-priced)")
    if d.redundant_experts:
        flags += ["--ep-num-redundant-experts", str(d.redundant_experts)]
    if location_json and (R > 1 or d.redundant_experts):
        flags += ["--init-expert-location", location_json]
    quant = _quant(d, flags, unsupported, notes)
    unsupported += moetune_only(d, "SGLang")
    knobs = engine_knobs(d, "sglang", overlap_ok=G == 1 if mesh is None else bool(d.moe_a2a and R > 1))
    flags += knobs.flags
    notes += knobs.notes
    unsupported += knobs.unsupported
    if d.offload_resident_fraction < 1:
        unsupported.append("expert offloading with prefetch (no SGLang equivalent)")
    instances = d.replicas
    if d.replicas > 1 and not attn_dp:
        flags += ["--dp-size", str(d.replicas)]
        instances = 1
        notes.append(f"replicas: SGLang's data parallelism, {d.replicas} copies behind its own load balancer")
    notes.append("max_num_batched_tokens has no exact SGLang twin; --chunked-prefill-size is the closest")
    spec = sglang_speculative(t.speculative, attn_dp)
    flags += spec.flags
    n = nodes_of(d, t)
    nodes = [flags] if n == 1 else [flags + ["--nnodes", str(n), "--node-rank", str(k), "--dist-init-addr",
                                             f"$HEAD_IP:{DIST_PORT}"] for k in range(n)]
    ran = mesh.as_run if mesh is not None and mesh.as_run is not None else d
    as_run = knobs_as_run(d, fp8_as_run(d, as_engine_runs(ran, d.placement, quant)), knobs)
    return Launch("sglang", nodes, as_run, unsupported, notes + spec.notes, instances,
                  describe(t.speculative) if t.speculative else None, spec.gaps)


def _expert_parallel(d: Deployment, R: int, G: int, notes: list) -> list[str]:
    if G == 1:
        return ["--ep-size", str(R), "--moe-a2a-backend", "deepep"]
    if d.expert_tp_size == 1:
        notes.append(f"experts whole on each of a group's {G} TP ranks has no SGLang flag: SGLang splits them "
                     f"(MoE TP {G}) (not re-priced)")
    notes.append("SGLang's all-to-all backends force ep = tp: at G > 1 its default dispatcher runs "
                 "(all-gather, not the all-to-all priced)")
    return ["--ep-size", str(R)]


def _quant(d: Deployment, flags: list, unsupported: list, notes: list) -> bool:
    low = d.quant_low_format
    if low in ("none", "fp8") and fp8_weights(d):
        flags += ["--quantization", "fp8"]
        notes.append("--quantization fp8 (online, or an fp8 checkpoint as stored) quantizes the dense layers and "
                     "every expert: re-priced with both fp8")
    elif d.dense_format == "fp8":
        unsupported.append(f"fp8 dense weights beside {low} experts (one --quantization: re-priced bf16 dense)")
    if low == "none":
        return True
    if low != "fp8":
        unsupported.append(f"{low} experts (SGLang's int8/int4 paths need a pre-quantized checkpoint)")
        return False
    if d.quant_hot_fraction > 0:
        unsupported.append(f"hot experts kept in full precision ({d.quant_hot_fraction:g}): SGLang quantizes "
                           "every expert (re-priced with hot fraction 0)")
    return True
