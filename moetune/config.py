"""RunConfig: one typed description of a deployment, loaded from a recipe YAML or CLI flags.

`load_recipe()` turns YAML into a validated RunConfig; unknown keys, wrong types and impossible
values are `RecipeError`s naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from moetune.errors import RecipeError

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    path: str | None = None  # checkpoint dir or bundled name; None = the bundled default
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: fp32 on CPU, bf16 on CUDA
    device: str = "auto"  # auto: cuda if available, else cpu
    kernel_backend: Literal["auto", "torch", "cpu", "triton"] = "auto"  # auto: triton on CUDA, cpu elsewhere
    threads: int | None = Field(None, ge=1)  # CPU threads (torch and the CPU kernels); None: the cores it may use


class ParallelConfig(_Section):
    """Expert parallelism (docs/architecture.md §3c: R ranks hold P = E + N physical slots, P / R each) and tensor
    parallelism (docs/architecture.md §3f): a mesh of ep_size groups × G ranks, G = max(tp_size,
    expert_tp_size); the G ranks of a group share one token stream."""

    ep_size: int = Field(1, ge=1)  # R: expert-parallel ranks (data-parallel attention groups)
    tp_size: int = Field(1, ge=1)  # attention, dense MLPs, embedding and LM head split over G ranks (1: whole)
    expert_tp_size: int | None = Field(None, ge=1)  # each expert's intermediate dim split; None: = tp_size
    ranks_per_node: int = Field(1, ge=1)
    placement: str = "contiguous"  # a policy (contiguous | round_robin) or a placement JSON (moetune placement)
    redundant_experts: int = Field(0, ge=0)  # N extra slots for hot-expert replicas (policy placements)
    capacity_factor: float | None = Field(None, gt=0)  # per-expert capacity ceil(cf·T·K/E) per rank's step
    capacity_policy: Literal["none", "drop", "reroute", "buffer"] = "none"  # overflow: kept / dropped / next-best / 2nd pass
    dispatch_dtype: Literal["auto", "bf16", "fp16"] = "auto"  # all-to-all rows: auto = the model dtype
    timeout_s: float = Field(120.0, gt=0)  # a collective waiting longer fails (a rank died or hangs)

    @property
    def expert_tp(self) -> int:
        return self.tp_size if self.expert_tp_size is None else self.expert_tp_size

    @property
    def group_size(self) -> int:
        """G: ranks that share one token stream (a tensor-parallel group)."""
        return max(self.tp_size, self.expert_tp)

    @property
    def world(self) -> int:
        """Processes the mesh runs on: ep_size × G."""
        return self.ep_size * self.group_size

    @model_validator(mode="after")
    def _tp_mesh(self) -> "ParallelConfig":
        G = self.group_size
        if self.tp_size not in (1, G) or self.expert_tp not in (1, G):
            raise ValueError(f"parallel.tp_size={self.tp_size} and parallel.expert_tp_size={self.expert_tp} must "
                             f"each be 1 or the group size {G} (a mesh of ep_size × {G} ranks)")
        return self

    @model_validator(mode="after")
    def _capacity(self) -> "ParallelConfig":
        if self.capacity_policy != "none" and self.capacity_factor is None:
            raise ValueError(f"capacity_policy '{self.capacity_policy}' needs parallel.capacity_factor")
        return self


class EngineConfig(_Section):
    """The scheduler's step budget and the paged KV cache (docs/architecture.md §1, `Engine.step`)."""

    max_num_seqs: int = Field(64, ge=1)  # sequences running at once
    max_num_batched_tokens: int = Field(8192, ge=1)  # tokens computed per step (decodes + prefill chunks)
    block_size: int = Field(16, ge=1)  # tokens per KV-cache block
    num_kv_blocks: int | None = Field(None, ge=1)  # None: max_num_seqs full contexts, capped by kv_cache_gb
    kv_cache_gb: float = Field(4.0, gt=0)
    prefix_caching: bool = True  # share full KV blocks of identical prompt prefixes
    chunked_prefill: bool = True  # split long prompts over steps, beside decodes
    max_model_len: int | None = Field(None, ge=1)  # None: the model's context
    scheduling: Literal["fcfs", "affinity"] = "fcfs"  # admission order (engine/affinity.py)
    affinity_max_wait: int = Field(8, ge=1)  # steps a request may wait beyond FCFS order's admission (affinity)
    speculative: str | None = None  # "ngram:K" | "draft:DIR:K" | "mtp:K": K drafted tokens verified per decode;
    # a ":auto" suffix (ngram:K:auto, …): k chosen per step in 0 .. K (engine/speculative/adaptive.py)

    @field_validator("speculative")
    @classmethod
    def _speculative(cls, value: str | None) -> str | None:
        if value is not None:
            parse_speculative(value)
        return value


@dataclass(frozen=True)
class SpeculativeSpec:
    """A parsed `engine.speculative`: the speculator and how many tokens it drafts per step."""

    method: Literal["ngram", "draft", "mtp"]
    k: int  # draft tokens verified per sequence and step (the lookahead the scheduler budgets)
    path: str | None = None  # draft: the draft model's checkpoint directory (or bundled name)
    max_ngram: int = 3  # ngram: the longest suffix looked up in the sequence's own tokens
    min_ngram: int = 2  # ngram: the shortest (1-gram matches guess badly: engine/speculative/ngram.py)
    adaptive: bool = False  # ":auto": k chosen per step in 0 .. k from the measured acceptance and the batch size


SPECULATIVE_FORMS = ("ngram:K (K draft tokens from the sequence's own earlier tokens), draft:DIR:K (K tokens "
                     "a smaller checkpoint DIR with the same vocabulary decodes greedily) or mtp:K (K tokens from "
                     "the checkpoint's own multi-token-prediction layer, num_nextn_predict_layers), 1 <= K <= 16; "
                     "any of them with ':auto' after K (ngram:4:auto) chooses k in 0 .. K per step from the "
                     "measured acceptance and the batch size")


def parse_speculative(text: str) -> SpeculativeSpec:
    """'ngram:K' | 'draft:DIR:K' | 'mtp:K', each optionally + ':auto' → SpeculativeSpec; anything else
    is a ValueError naming the forms."""
    adaptive = text.endswith(":auto")
    method, _, rest = text.removesuffix(":auto").partition(":")
    path, _, k = rest.rpartition(":") if method == "draft" else (None, "", rest)
    if method not in ("ngram", "draft", "mtp") or not k.isdigit() or not 1 <= int(k) <= 16 or path == "":
        raise ValueError(f"speculative '{text}' is not one of: {SPECULATIVE_FORMS}")
    return SpeculativeSpec(method, int(k), path, adaptive=adaptive)


class TenantConfig(_Section):
    """One tenant of `moetune serve` (chosen by the X-Tenant header): a token-rate limit, shares."""

    tokens_per_s: float | None = Field(None, gt=0)  # prompt + completion tokens per second; None = no limit
    burst_tokens: int | None = Field(None, ge=1)  # bucket size; None = one second of tokens_per_s
    expert_share: float | None = Field(None, gt=0, le=1)  # of each expert's capacity per step; None = no cap
    slot_share: float | None = Field(None, gt=0, le=1)  # of the running slots its sequences may hold; None = no cap


class ServeConfig(_Section):
    """`moetune serve`: HTTP front, admission control, recording; the engine settings live in `engine`."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)  # 0: any free port
    model_name: str | None = None  # name in /v1/models and responses; None = the checkpoint directory's name
    api_key_env: str | None = None  # name of an environment variable holding the API key (--api-key wins)
    max_queue: int = Field(256, ge=0)  # sequences waiting beyond engine.max_num_seqs; more get 429
    max_body_bytes: int = Field(1 << 20, ge=1024)  # request bodies over this get 413
    drain_timeout_s: float = Field(30.0, ge=0)  # on SIGTERM: time given to in-flight requests, then aborted
    metrics_window_steps: int = Field(256, ge=1)  # sliding window of the live expert-load metrics
    record_dir: str = "runs"  # where /v1/expert_distribution/dump writes run directories
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)  # by X-Tenant value; others: no limit
    expert_capacity_factor: float = Field(1.0, gt=0)  # an expert's capacity per step: ceil(cf · decodes · K / E)
    max_request_share: float = Field(0.5, gt=0, le=1)  # of the running slots one request's sequences may hold
    head_timeout_s: float = Field(10.0, gt=0, le=600)  # a request head not complete by then gets 408
    slow_heads_per_client: int = Field(256, ge=1)  # heads one address may keep incomplete over 1 s; more get 408
    stream_interval: int | None = Field(None, ge=1)  # engine steps between a request's token hand-overs; None: auto
    warmup: bool = True  # before listening: run the kinds of step the first requests need (serve/warmup.py)


class QuantConfig(_Section):
    """Per-expert precision of the routed experts, and the format of the dense projections.

    At most one of: `experts` (one format for all), `hot_fraction` (+ `loads`: the ceil(f·E) most
    loaded experts of each layer keep `high`, the rest `low`), or `table` (a JSON precision table,
    moetune/quant/table.py). Formats: fp32 bf16 fp16 fp8 int8 int4-g32 int4-g64 int4-g128.
    `dense`: int8 | int4-gG packs every projection outside the experts (attention, dense and
    shared-expert MLPs, the LM head; model/dense_quant.py); unset, they keep model.dtype, as the
    router and the norms always do. At least one of the four is set.
    """

    experts: str | None = None
    hot_fraction: float | None = Field(None, ge=0, le=1)
    high: str = "fp32"
    low: str = "int4-g64"
    loads: str | None = None  # run directory of `moetune profile` whose expert loads rank the experts
    table: str | None = None
    dense: str | None = None  # int8 | int4-g32 | int4-g64 | int4-g128

    @model_validator(mode="after")
    def _one_policy(self) -> "QuantConfig":
        given = [k for k in ("experts", "hot_fraction", "table") if getattr(self, k) is not None]
        if len(given) > 1 or (not given and self.dense is None):
            raise ValueError("quant needs exactly one of experts, hot_fraction (with loads) or table, "
                             "and/or dense")
        if self.hot_fraction is not None and self.loads is None:
            raise ValueError("quant.hot_fraction needs quant.loads (a run directory of moetune profile)")
        return self  # format names are checked against moetune.quant when the model is built


class OffloadConfig(_Section):
    """Keep only some routed experts resident; fetch the rest from host memory or disk (experts/offload.py)."""

    resident_experts: int | None = Field(None, ge=1)  # per MoE layer
    resident_fraction: float | None = Field(None, gt=0, le=1)  # of E per MoE layer (rounded up)
    policy: Literal["lru", "lfu", "score"] = "lru"  # eviction
    tier: Literal["host", "disk"] = "host"  # where non-resident experts live
    dir: str | None = None  # disk tier / disk_after: directory for the expert blobs (None: a temporary one)
    prefetch_depth: int = Field(1, ge=0, le=3)  # layers ahead whose experts are predicted and fetched
    warm_start: str | None = None  # run directory or JSON loads file: the most loaded experts loaded first
    demote_after: int = Field(0, ge=0)  # steps an expert may stay resident unused, then demoted (0: never)
    disk_after: int = Field(0, ge=0)  # tier host: steps an expert may stay at host unused, then to disk (0: never)
    hints: Literal["router", "history", "both"] = "router"  # prefetch from the next layers' routers, the
    # sequences' routing history (traces beside the KV blocks), or both (experts/offload.py)

    @model_validator(mode="after")
    def _one_capacity(self) -> "OffloadConfig":
        if (self.resident_experts is None) == (self.resident_fraction is None):
            raise ValueError("offload needs exactly one of resident_experts or resident_fraction")
        if self.disk_after and self.tier == "disk":
            raise ValueError("offload.disk_after moves idle host experts to disk, but with tier disk every "
                             "non-resident expert is on disk already: use tier host with disk_after, or drop it")
        return self


class DeployConfig(_Section):
    """How the serving engines (vLLM, SGLang) deploy the model on GPUs: knobs `moetune simulate` and
    `moetune search` price on GPU hardware and the emitted launch files say. moetune's own engine does
    not run them (it serves the `parallel` mesh); a search winner's recipe carries them so that
    `moetune simulate --recipe winner.yaml` prices the same deployment (docs/search.md)."""

    replicas: int = Field(1, ge=1)  # copies of the deployment across the hardware's GPUs
    dense_format: Literal["none", "fp8"] = "none"  # attention / dense / shared-expert weights (--quantization fp8)
    kv_format: Literal["none", "fp8"] = "none"  # the KV cache (--kv-cache-dtype fp8)
    overlap: bool = False  # two-batch overlap (SGLang --enable-two-batch-overlap, vLLM --enable-dbo)
    cuda_graph_max_bs: int = Field(-1, ge=-1)  # largest decode batch per rank in a CUDA graph; 0 eager; -1 not priced
    attn_dp: int = Field(0, ge=0)  # attention DP groups over ep_size × expert_tp_size GPUs (TP = tp_size); 0: parallel's mesh
    moe_a2a: bool = True  # under attn_dp > 0: all-to-all dispatch (DeepEP) rather than all-gather + reduce-scatter
    prefill_workers: int = Field(0, ge=0)  # disaggregated prefill/decode: P prefill workers (0: aggregated)
    decode_workers: int = Field(1, ge=1)  # ... D decode workers, each the `parallel` mesh above
    prefill_ep_size: int = Field(1, ge=1)  # ... a prefill worker's expert parallelism
    prefill_tp_size: int = Field(1, ge=1)  # ... its attention tensor parallelism
    prefill_expert_tp_size: int = Field(1, ge=1)  # ... its expert tensor parallelism
    prefill_max_num_batched_tokens: int = Field(8192, ge=1)  # ... its tokens per step (per attention-DP rank)


# Sections the recipe format reserves for features not built yet: setting one is an error, not a no-op.
NOT_YET: dict[str, str] = {}


class RunConfig(_Section):
    name: str = "default"
    model: ModelConfig = ModelConfig()
    parallel: ParallelConfig = ParallelConfig()
    engine: EngineConfig = EngineConfig()
    serve: ServeConfig = ServeConfig()
    quant: QuantConfig | None = None
    offload: OffloadConfig | None = None
    deploy: DeployConfig | None = None  # the serving engines' knobs (priced on GPUs; moetune's engine ignores it)

    def engine_refusal(self) -> str | None:
        """Why moetune's own engine cannot serve this recipe as written: its `deploy` section names a mesh
        or a disaggregated form only the serving engines run (the winner's launch files), or None."""
        d = self.deploy
        if d is None or not (d.attn_dp or d.prefill_workers):
            return None
        what = f"deploy.attn_dp {d.attn_dp}" if d.attn_dp else f"deploy.prefill_workers {d.prefill_workers}"
        return (f"{what} is a vLLM / SGLang deployment (run the winner's launch files); moetune's engine serves "
                "the parallel mesh only: remove it from the deploy section to run this recipe here")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unbuilt(cls, data):
        if isinstance(data, dict):
            for section, feature in NOT_YET.items():
                if section in data:
                    raise ValueError(f"recipe section '{section}' ({feature}) is not implemented yet; remove it")
        return data

    @model_validator(mode="after")
    def _ranks_fit(self) -> "RunConfig":
        p = self.parallel
        if p.ep_size > 1 and p.ep_size % p.ranks_per_node and p.ranks_per_node % p.ep_size:
            raise ValueError(f"parallel.ep_size={p.ep_size} and parallel.ranks_per_node={p.ranks_per_node} do not tile")
        return self

    @model_validator(mode="after")
    def _adaptive_k_on_one_group(self) -> "RunConfig":
        """An adaptive k (`:auto`) is chosen from each rank's own step times: the ranks of a
        tensor-parallel group, which must draft the same tokens, could choose different k."""
        if self.engine.speculative and self.engine.speculative.endswith(":auto") and self.parallel.group_size > 1:
            raise ValueError(f"engine.speculative '{self.engine.speculative}' (adaptive k) with parallel.tp_size="
                             f"{self.parallel.tp_size} (expert_tp_size={self.parallel.expert_tp}) is not supported: each "
                             "rank would choose k from its own step times; give a fixed K on a tensor-parallel group")
        return self

    @model_validator(mode="after")
    def _offload_on_one_rank(self) -> "RunConfig":
        """Offloading fetches the experts a rank's own tokens chose, before dispatch: under expert
        parallelism a rank computes other ranks' copies, and a replica would be a second cache entry
        of one expert. Neither is built yet, so the pair is refused here, before any model loads."""
        p = self.parallel
        if self.offload is not None and (p.ep_size > 1 or p.redundant_experts):
            raise ValueError(f"offload with parallel.ep_size={p.ep_size} and redundant_experts={p.redundant_experts} "
                             "is not supported yet (offloading runs on one rank without replicas); drop the offload "
                             "section or use ep_size 1 and redundant_experts 0")
        return self


def load_recipe(path: str | Path) -> RunConfig:
    data = read_yaml_mapping(path, "recipe", RecipeError, "a mapping of sections (model, parallel, ...)")
    return parse_config(data, source=str(path))


def read_yaml_mapping(path: str | Path, what: str, error: type[Exception], shape: str) -> dict:
    """A YAML file holding one mapping (a recipe, a search space): missing, malformed or not a
    mapping is one `error` line naming the file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise error(f"{what} '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise error(f"{what} '{path}' is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise error(f"{what} '{path}' must be {shape}")
    return data


def parse_config(data: dict, source: str = "recipe") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"{source}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(part) for part in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    return msg if not err["loc"] else f"key '{key}': {msg}"
