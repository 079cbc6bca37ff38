"""What a serving engine is told to run for a search winner: its launch commands (one per node),
the knobs it has no flag for, and the deployment it will actually run (the winner without those
knobs, which the study re-prices). vllm_launch.py and sglang_launch.py build one each; emit.py
writes them out; flag_table.py parses every command with the engine's own argument parser.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from moetune.config import SpeculativeSpec
from moetune.search.cost.deployment import Deployment, gpus


@dataclass(frozen=True)
class ServeTarget:
    """What the launch serves on, resolved once by the study: the model id the engine loads, the
    model's family (support differs by family) and the hardware's shape."""

    model_id: str  # --hf-id, else the local checkpoint, else the placeholder $MODEL_DIR
    model_type: str  # config.json model_type
    expert_groups: int  # the router's groups (vLLM's round-robin placement needs > 1)
    gpus_per_node: int
    gpu: str = "GPU"  # the hardware's name, for the file's header
    # the recipe's engine.speculative, its draft model resolved like model_id (else $DRAFT_DIR); None: off
    speculative: SpeculativeSpec | None = None
    device: str = "cuda"  # "cpu": this machine without a GPU (launch_env.py: what the engines' CPU builds need)


@dataclass
class Launch:
    engine: str  # "vllm" | "sglang"
    nodes: list[list[str]]  # per node of one replica: the launch argv (after the launcher)
    as_run: Deployment  # what the engine runs (the winner without `unsupported`)
    unsupported: list[str] = field(default_factory=list)  # priced knobs with no flag: re-priced without
    notes: list[str] = field(default_factory=list)  # how a flag maps, where the engine differs
    instances: int = 1  # copies of this launch (replicas the engine cannot express itself)
    speculative: str | None = None  # the recipe's engine.speculative the flags carry ("ngram:4"); None: off
    speculative_gaps: list[str] = field(default_factory=list)  # its parameters with no flag (never priced)


def world(d: Deployment) -> int:
    """GPUs of one replica: ep_size DP groups × G tensor-parallel ranks (engine/mesh.py), or a general
    mesh's ep_size × expert_tp_size (cost/mesh.py)."""
    return gpus(d)


def nodes_of(d: Deployment, t: ServeTarget) -> int:
    """Nodes one replica spans (a replica smaller than a node shares it with others)."""
    return max(1, -(-world(d) // t.gpus_per_node))


def as_engine_runs(d: Deployment, placement: str, quant: bool) -> Deployment:
    """The winner as an engine without offloading runs it: its placement (`placement`), its experts
    low-bit only where it can deploy them (`quant`), and then all of them (no hot fraction); dropless
    (no capacity) and in arrival order (no expert-affinity scheduling: `moetune_only`)."""
    from dataclasses import replace

    out = replace(d, offload_resident_fraction=1.0, offload_prefetch_depth=0, offload_eviction="lru",
                  placement=placement, quant_hot_fraction=0.0, offload_hints="router", capacity_policy="none",
                  capacity_factor=1.0, scheduling="fcfs")
    return out if quant else replace(out, quant_low_format="none")


def moetune_only(d: Deployment, engine: str) -> list[str]:
    """The winner's capacity and scheduling knobs that `engine` (vLLM, SGLang) has no flag for: both
    serve MoE layers dropless, admitting in arrival order (re-priced without them)."""
    out = []
    if d.capacity_policy != "none":
        out.append(f"capacity {d.capacity_policy} at factor {d.capacity_factor:g} ({engine} runs MoE layers dropless)")
    if d.scheduling != "fcfs":
        out.append(f"{d.scheduling} scheduling ({engine} admits requests in arrival order)")
    return out


def shell_args(argv: list[str]) -> str:
    """argv as shell words, flag and value on one line each; $PLACEHOLDERS expand."""
    def word(a: str) -> str:  # a $PLACEHOLDER inside JSON: double quotes, its own quotes escaped
        if "$" not in a:
            return shlex.quote(a)
        return '"' + a.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'

    groups, i = [], 0
    while i < len(argv):
        take = 2 if argv[i].startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1
        groups.append(" ".join(word(a) for a in argv[i:i + take]))
        i += take
    return " \\\n  ".join(groups)
