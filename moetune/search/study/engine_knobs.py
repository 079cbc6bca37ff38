"""The serving engines' own knobs a winner carries (precision.py, overlap.py; no moetune recipe key):
dense / KV-cache precision, two-batch overlap and CUDA graphs, as vLLM 0.33.0 and SGLang 0.5.23
flags (flag_tables/*.json), and what each engine runs where it has no flag (re-priced without).

| knob | vLLM | SGLang |
|---|---|---|
| dense_format fp8 (and fp8 experts) | `--quantization fp8`: dense layers and every expert (an fp8 checkpoint such as DeepSeek-V3's is read as stored) | `--quantization fp8`: likewise |
| kv_format fp8 | `--kv-cache-dtype fp8` | `--kv-cache-dtype fp8_e4m3` |
| overlap 1 | `--enable-dbo` (dual-batch overlap, DP + EP) | `--enable-two-batch-overlap` (needs the DeepEP all-to-all: ep = tp, no attention TP) |
| cuda_graph_max_bs 0 | `--enforce-eager` | `--disable-decode-cuda-graph` |
| cuda_graph_max_bs n | `--max-cudagraph-capture-size n` | `--cuda-graph-max-bs-decode n` |
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from moetune.search.cost.deployment import Deployment

KV_DTYPE = {"vllm": "fp8", "sglang": "fp8_e4m3"}
GRAPH_FLAGS = {"vllm": ("--enforce-eager", "--max-cudagraph-capture-size"),
               "sglang": ("--disable-decode-cuda-graph", "--cuda-graph-max-bs-decode")}
OVERLAP_FLAG = {"vllm": "--enable-dbo", "sglang": "--enable-two-batch-overlap"}


@dataclass
class EngineKnobs:
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


def fp8_weights(d: Deployment) -> bool:
    """Whether the launch says `--quantization fp8` (fp8 dense weights or fp8 experts)."""
    return d.dense_format == "fp8" or d.quant_low_format == "fp8"


def fp8_as_run(d: Deployment, as_run: Deployment) -> Deployment:
    """`--quantization fp8` quantizes the dense layers and every expert: the deployment as run."""
    if d.quant_low_format not in ("none", "fp8"):  # int8 / int4 experts: no fp8 flag beside them
        return replace(as_run, dense_format="none")
    if not fp8_weights(d):
        return as_run
    return replace(as_run, dense_format="fp8", quant_low_format="fp8", quant_hot_fraction=0.0)


def engine_knobs(d: Deployment, engine: str, overlap_ok: bool = True) -> EngineKnobs:
    """KV precision, overlap and CUDA-graph flags of `engine` (vllm | sglang); `overlap_ok`: the
    engine can overlap this mesh (SGLang: the DeepEP all-to-all runs)."""
    out = EngineKnobs()
    if d.kv_format == "fp8":
        out.flags += ["--kv-cache-dtype", KV_DTYPE[engine]]
    if d.overlap and d.ep_size > 1:
        if overlap_ok:
            out.flags.append(OVERLAP_FLAG[engine])
        else:
            out.unsupported.append("two-batch overlap (SGLang overlaps only on the DeepEP all-to-all, which needs "
                                   "ep = tp: re-priced without)")
    eager, size = GRAPH_FLAGS[engine]
    if d.cuda_graph_max_bs == 0:
        out.flags.append(eager)
    elif d.cuda_graph_max_bs > 0:
        out.flags += [size, str(d.cuda_graph_max_bs)]
        out.notes.append(f"CUDA graphs: decode batches up to {d.cuda_graph_max_bs} per rank replay a graph "
                         "(priced so); larger ones launch eagerly")
    return out


def knobs_as_run(d: Deployment, as_run: Deployment, knobs: EngineKnobs) -> Deployment:
    """as_run without the overlap the engine cannot run here."""
    if d.overlap and not any(f in knobs.flags for f in OVERLAP_FLAG.values()):
        return replace(as_run, overlap=0)
    return as_run
