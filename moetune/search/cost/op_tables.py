"""Measured GPU op costs: NVIDIA's kernel tables (the `gpu-db` extra) priced at each step's real
per-rank shapes, with the roofline (hardware.py) as the fallback where a table has no entry.

`pip install "moetune[gpu-db]"` installs `aiconfigurator-core` (Apache-2.0): measured latencies of
GEMMs (bf16 / fp8 / fp8-block), fused MoE per quant mode, context and generation attention (MLA
too), custom all-reduce and NCCL collectives, per system (h100_sxm, h200_sxm, b200_sxm, ...), engine
(vllm, sglang) and engine version. `--engine` / `--engine-version` pick the tables (default: vllm at
the package's current version). Without the extra, or on hardware the tables lack (this-machine, a
YAML file), every op keeps the datasheet roofline, labelled `roofline (unmeasured)`.

How an op of one step is priced (each on the rank's own shapes: the TP split, `tp.tp_model`):

| phase | table op | at |
|---|---|---|
| attention (GQA) | GEMM qkv + GEMM o + context attention (prompt tokens) + generation attention (decode rows) | tokens; prompt tokens as b prompts of s tokens (b·s = prompt tokens, b·s²/2 = their pairs); decode rows at their mean KV length (`mixed_split`) |
| attention (MLA) | vLLM: its MLA module (projections included); SGLang: q/KV down-projection + q up-projection + the absorbed BMMs + the MLA kernel + o (`mla_projections`) | as above |
| router | GEMM (E × D, bf16) | tokens |
| experts | fused MoE (expert TP × EP of the deployment, `balanced` tokens); a hot/low mix: one per format (`mixed_experts`) | N = the rank's own rows · R / K: the rank's rows from the routing trace (EPLB, replicas, placement applied), so the hottest rank is priced at its real load; a mix: each format at its own rows per expert |
| permute, unpermute | inside the fused MoE kernel | 0 where the experts are measured |
| shared expert, dense MLP | GEMM gate/up + GEMM down (the shared expert beside the routed path in the steps the engine runs it on a second stream: `phase_costs.shared_beside_experts`, `second_stream`) | tokens |
| other | GEMM LM head (V × D, bf16) + the per-step calls (roofline) | sampled rows |
| dispatch, combine | DeepEP low-latency (decode steps) / high-throughput (steps with a prompt) where measured at the EP size and node count, else the engine's own MoE dispatch | the largest rank's tokens |
| TP collectives | custom all-reduce, fitted to tp.tp_collectives' α + bytes / B at the step kind's payloads | |

A curve per op and deployment shape is sampled once from the tables (tokens on a grid from 1 to
2^17, attention on a batch × KV-length grid) and each step is priced with numpy interpolation
(`np.interp`, bilinear on the 2-D grids), so a trial's thousands of steps cost a few array
operations. Every priced phase records its source (`Measured.sources`) and its measured seconds;
`trial_figures` turns them into a trial's `measured_share` of its step time.

The table interface (`OpBackend.latency_ms(op, x, y)`) has two implementations: `AicBackend` (the
real package) and `ParquetBackend` (GEMM rows of a `gemm_perf.parquet` in the package's own on-disk
layout: what the tests use without the extra).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from moetune.search.cost import moe_rows
from moetune.search.cost.table_curves import at, at2, hot_share, mixed_experts

UNMEASURED = "roofline (unmeasured)"
ENGINES = ("vllm", "sglang")
SYSTEMS = {"H100": "h100_sxm", "H200": "h200_sxm", "B200": "b200_sxm"}  # moetune's hardware → the tables' system
PACKAGE = "aiconfigurator_core"
MEASURED_SOURCES = ("silicon", "mixed")  # the package's per-value provenance counted as measured
TOKENS = np.unique(np.concatenate([np.arange(1, 17), np.round(2 ** np.arange(4, 17.01, 0.25))])).astype(np.int64)
BATCH = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
KV_LEN = np.array([16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
PROMPT = np.array([16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])


# ---- the ops a table is asked about ---------------------------------------------------------------

@dataclass(frozen=True)
class Gemm:
    n: int
    k: int
    quant: str  # bfloat16 | fp8 | fp8_block


@dataclass(frozen=True)
class Moe:
    D: int
    I: int  # the whole expert's intermediate size (the table splits it by tp)
    K: int
    E: int
    tp: int
    ep: int
    quant: str  # bfloat16 | fp8 | fp8_block | int4_wo


@dataclass(frozen=True)
class Attention:
    context: bool  # prefill (context attention: x batch, y prompt) | decode (x batch, y KV length)
    heads: int
    kv_heads: int  # 0: MLA
    head_dim: int
    kv_quant: str  # bfloat16 | fp8
    module: bool = False  # MLA module (projections included)


@dataclass(frozen=True)
class MlaBmm:
    """MLA's absorbed batched matmul before (pre) or after (post) the attention kernel, x tokens."""

    heads: int
    pre: bool
    quant: str  # bfloat16 | fp8


@dataclass(frozen=True)
class AllReduce:
    D: int  # a message of x tokens × D elements
    G: int  # ranks


@dataclass(frozen=True)
class Dispatch:
    """The engine's MoE dispatch (pre) or combine (post) among ep ranks of attention-DP groups."""

    D: int
    K: int
    E: int
    ep: int
    pre: bool
    quant: str
    engine: str


@dataclass(frozen=True)
class DeepEP:
    """DeepEP's all-to-all (low-latency kernels for decode, high-throughput for prefill) over ep ranks."""

    low_latency: bool
    dispatch: bool  # dispatch | combine
    D: int
    K: int
    E: int
    ep: int
    nodes: int


@dataclass(frozen=True)
class Nccl:
    """An NCCL collective (all_gather | reduce_scatter | all_reduce | alltoall) among G ranks of a
    message of x tokens × D elements (bf16): the gathered / scattered / reduced buffer (collective_tables.py)."""

    op: str
    D: int
    G: int


Op = Gemm | Moe | Attention | MlaBmm | AllReduce | Dispatch | DeepEP | Nccl


class OpBackend(Protocol):
    """One engine's tables on one system: a latency in ms, or None where there is no entry."""

    label: str

    def latency_ms(self, op: Op, x: int, y: int = 1) -> float | None: ...


# ---- the real package -----------------------------------------------------------------------------

def installed() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


class AicBackend:
    """aiconfigurator-core's tables for (system, engine, version) through its op-list interface."""

    def __init__(self, system: str, engine: str, version: str | None, unlisted: bool = False):
        from importlib.metadata import version as pkg_version

        from aiconfigurator_core.sdk import perf_database
        from aiconfigurator_core.sdk.engine import EngineHandle

        slots = perf_database.get_version_slots(system, engine) or {}
        self.version = version or slots.get("current") or "current"
        # unlisted: a version outside the package's queryable slots (an older collection: moe_rows.py)
        self.db = perf_database.get_database(system, engine, self.version, allow_unlisted_version=unlisted)
        if self.db is None:
            raise LookupError(f"no {engine} {self.version} tables for {system}")
        self.handle = EngineHandle.for_database(self.db)
        self.system, self.engine = system, engine
        self.label = f"aiconfigurator-core {pkg_version('aiconfigurator-core')}: {system} {engine} {self.version}"

    def latency_ms(self, op: Op, x: int, y: int = 1) -> float | None:
        from aiconfigurator_core.sdk.engine import build_ops_json

        built = self._op(op)
        context = (isinstance(op, Attention) and op.context) or (isinstance(op, DeepEP) and not op.low_latency)
        try:
            _, ms, _, source = self.handle.evaluate_ops_json(build_ops_json([built]), is_context=context,
                                                             batch_size=int(x), s=int(y))[0]
        except Exception:  # the package raises its own errors for a shape without rows
            return None
        return float(ms) if source in MEASURED_SOURCES and ms > 0 else None

    def moe_rows(self, op: Moe) -> tuple["AicBackend", str | None]:
        """The tables whose fused-MoE rows price op, and the note naming them where they are not the asked
        version's own (`moe_rows.pick`: an older version's where this one lacks the shape, or where its rows
        are another quantization method's kernel than the engine runs for the launch)."""
        if getattr(self, "_moe_keys", None) is None:  # the sources are reported once a table was read
            self._moe_keys = moe_rows.source_keys(self.db)
        version, note = moe_rows.pick(self._moe_keys, self.engine, self.version,
                                      (op.quant, op.D, op.I, op.K, op.E, op.tp, op.ep))
        if version is None:
            return self, note
        return _aic_backend(self.system, self.engine, version, True), note

    def _op(self, op: Op):
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        if isinstance(op, Gemm):
            return ops.GEMM("gemm", 1, op.n, op.k, common.GEMMQuantMode[op.quant])
        if isinstance(op, Moe):
            return ops.MoE("moe", 1, op.D, op.I, op.K, op.E, op.tp, op.ep, common.MoEQuantMode[op.quant],
                           "balanced", 1)
        if isinstance(op, DeepEP):
            backend = "deepep_ll" if op.low_latency else "deepep_ht"
            return ops.MoEAllToAll("a2a", 1, phase="dispatch" if op.dispatch else "combine", comm_dtype="default",
                                   comm_backend=backend, hidden_size=op.D, topk=op.K, num_experts=op.E,
                                   moe_ep_size=op.ep, node_num=op.nodes, sms=0 if op.low_latency else 20,
                                   attention_tp_size=1)
        if isinstance(op, Dispatch):
            return ops.MoEDispatch("dispatch", 1, op.D, op.K, op.E, 1, op.ep, op.ep, op.pre,
                                   quant_mode=common.MoEQuantMode[op.quant], backend=op.engine)
        if isinstance(op, AllReduce):
            return ops.CustomAllReduce("allreduce", 1, op.D, op.G)
        if isinstance(op, Nccl):
            return ops.NCCL("nccl", 1, op.op, op.D, op.G, common.CommQuantMode.half)
        if isinstance(op, MlaBmm):
            return ops.MLABmm("bmm", 1, op.heads, common.GEMMQuantMode[op.quant], if_pre=op.pre)
        kv = common.KVCacheQuantMode[op.kv_quant]
        fmha = common.FMHAQuantMode.bfloat16
        if op.module:
            return ops.MLAModule("mla", 1, op.context, op.heads, kv, fmha, common.GEMMQuantMode.fp8_block,
                                 native_num_heads=op.heads)
        if op.kv_heads == 0:
            return (ops.ContextMLA("mla", 1, op.heads, kv, fmha) if op.context
                    else ops.GenerationMLA("mla", 1, op.heads, kv))
        if op.context:
            return ops.ContextAttention("attn", 1, op.heads, op.kv_heads, kv, fmha, head_size=op.head_dim)
        return ops.GenerationAttention("attn", 1, op.heads, op.kv_heads, kv, head_size=op.head_dim)


def mixed_split(T, prefill, pairs, context):
    """(decode rows, their mean KV length, prompts b, prompt length s) of a rank's step (each [...]): the
    prompt tokens are b prompts of s tokens (b·s = prefill, b·s²/2 their pairs), the decode rows read
    their own KV through the generation kernel, as the engines run them and the peer prices a mixed step
    (AIConfigurator `rust_engine_step.estimate_mixed_step_breakdown_with_rust`). In the schedule's counts
    a decode row's pairs = KV = computed + 1 and a prompt chunk's KV = prefix + tokens, so the decode
    rows' KV is context − prefill: exact where each chunk starts its prompt, over by continued chunks'
    prefixes (≤ max_num_batched_tokens a step against the decode rows' KV)."""
    T, prefill = np.asarray(T, dtype=np.float64), np.asarray(prefill, dtype=np.float64)
    decode = np.maximum(T - prefill, 0)
    dec_kv = np.where(decode > 0, np.maximum(np.where(prefill > 0, context - prefill, context), 0), 0)
    dec_len = np.where(decode > 0, dec_kv / np.maximum(decode, 1), 0)
    pre_pairs = np.maximum(pairs - dec_kv, prefill)  # each prompt token sees at least itself
    prompt = np.where(prefill > 0, np.maximum(2 * pre_pairs / np.maximum(prefill, 1), 1), 1)
    return decode, dec_len, prefill / prompt, prompt


class ParquetBackend:
    """GEMM rows of a `gemm_perf.parquet` in the package's layout (columns gemm_dtype, m, n, k,
    latency in ms): a measured (n, k, dtype) is interpolated in m; anything else has no entry."""

    def __init__(self, path: str | Path, label: str | None = None):
        import pyarrow.parquet as pq

        t = pq.read_table(str(path)).to_pydict()
        rows: dict[tuple, list] = {}
        for q, m, n, k, ms in zip(t["gemm_dtype"], t["m"], t["n"], t["k"], t["latency"]):
            rows.setdefault((int(n), int(k), str(q)), []).append((int(m), float(ms)))
        self.rows = {key: np.array(sorted(v)).T for key, v in rows.items()}  # (n, k, q) → [2, M] (m, ms)
        self.label = label or f"file {path}"

    def latency_ms(self, op: Op, x: int, y: int = 1) -> float | None:
        if not isinstance(op, Gemm) or (op.n, op.k, op.quant) not in self.rows:
            return None
        m, ms = self.rows[(op.n, op.k, op.quant)]
        return float(np.interp(x, m, ms))


# ---- which tables a run uses ----------------------------------------------------------------------

@dataclass(frozen=True)
class TableChoice:
    """What `--engine` / `--engine-version` resolved to on the run's hardware."""

    engine: str
    version: str | None
    backend: OpBackend | None  # None: the roofline
    note: str  # what prices the ops, in words

    @property
    def label(self) -> str:
        return self.backend.label if self.backend is not None else UNMEASURED


def choose(hardware_name: str, engine: str = "vllm", version: str | None = None) -> TableChoice:
    """The tables for a hardware name (H100, H200, B200), or the roofline with the reason."""
    system = SYSTEMS.get(hardware_name.upper())
    if not installed():
        return TableChoice(engine, version, None, f"{UNMEASURED}: install moetune[gpu-db] for measured op tables")
    if system is None:
        return TableChoice(engine, version, None, f"{UNMEASURED}: the measured tables have no {hardware_name}; "
                           "its datasheet roofline prices every op")
    try:
        backend = _aic_backend(system, engine, version)
    except Exception as exc:  # an unknown version, a system without that engine's tables
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return TableChoice(engine, version, None, f"{UNMEASURED}: no {engine} {version or 'current'} tables for "
                           f"{system} ({first[:160]})")
    return TableChoice(engine, backend.version, backend, f"measured: {backend.label}; roofline where it has no entry")


@lru_cache(maxsize=8)
def _aic_backend(system: str, engine: str, version: str | None, unlisted: bool = False) -> AicBackend:
    return AicBackend(system, engine, version, unlisted)


# ---- curves: sampled once, priced with numpy ------------------------------------------------------

@lru_cache(maxsize=512)
def curve(backend: OpBackend, op: Op) -> np.ndarray | None:
    """[2, n] (tokens, seconds) of a one-variable op, or None where the table has no entry at all."""
    ys = [backend.latency_ms(op, int(x)) for x in TOKENS]
    keep = [i for i, y in enumerate(ys) if y is not None]
    if len(keep) < 2:
        return None
    return np.stack([TOKENS[keep].astype(np.float64), np.array([ys[i] for i in keep]) * 1e-3])


@lru_cache(maxsize=128)
def grid(backend: OpBackend, op: Attention) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(batch [nb], length [nl], seconds [nb, nl]) of an attention op, or None (a missing point:
    the nearest measured one along the length)."""
    lengths = PROMPT if op.context else KV_LEN
    sec = np.array([[backend.latency_ms(op, int(b), int(s)) or np.nan for s in lengths] for b in BATCH]) * 1e-3
    if np.isnan(sec).all():
        return None
    for row in sec:  # fill holes from the nearest measured length
        ok = ~np.isnan(row)
        if ok.any():
            row[~ok] = np.interp(np.nonzero(~ok)[0], np.nonzero(ok)[0], row[ok])
    good = ~np.isnan(sec).any(1)
    if good.sum() < 1:
        return None
    return BATCH[good].astype(np.float64), lengths.astype(np.float64), sec[good]


# ---- one deployment's measured ops ----------------------------------------------------------------

@dataclass
class Measured:
    """The tables bound to one deployment's per-rank shapes; each method gives seconds (the shape of
    its inputs) or None where the tables have no entry (the caller keeps the roofline)."""

    backend: OpBackend
    model: object  # SimModel: the whole model
    rank: object  # SimModel: one rank's shapes (tp.tp_model)
    tp: int
    etp: int
    ep: int
    dense_q: str
    expert_q: str | None  # None: a format the tables lack (int8 experts); with hot_q: the low format's
    kv_q: str
    engine: str = "vllm"
    nodes: int = 1  # nodes the EP group spans
    per_node: int = 8  # GPUs per node (a full node's DeepEP rows stand in across nodes: deepep_curves)
    hot_q: str | None = None  # a hot/low mix (quant.hot_fraction): the hot experts' format (the checkpoint's)
    hot_share: float = 0.0  # of each MoE layer's experts, the share kept in hot_q (ceil(hot_fraction · E) / E)
    seconds: dict = field(default_factory=dict)  # phase → [measured s, all s] priced so far
    sources: dict = field(default_factory=dict)  # phase → the label of what priced it

    def gemm(self, n: int, k: int, quant: str, tokens) -> np.ndarray | None:
        c = curve(self.backend, Gemm(int(n), int(k), quant))
        return None if c is None else at(c, tokens)

    def attention(self, T, prefill, pairs, context) -> np.ndarray | None:
        """[...] seconds of one layer's attention on each rank: its prompt tokens through the context
        kernel, its decode rows through the generation kernel (`mixed_split`), the projections on all T."""
        r, m = self.rank, self.model
        heads = max(1, m.heads // self.tp) if m.heads else 0
        if not heads:
            return None
        decode, dec_len, prompts, prompt = mixed_split(T, prefill, pairs, context)
        if m.kv_heads:
            dh = m.kv_elems // (2 * m.kv_heads)
            kvh = max(1, m.kv_heads // self.tp)
            proj = [self.gemm((heads + 2 * kvh) * dh, m.D, self.dense_q, T),
                    self.gemm(m.D, heads * dh, self.dense_q, T)]
            ops = (Attention(False, heads, kvh, dh, self.kv_q), Attention(True, heads, kvh, dh, self.kv_q))
        else:
            module = (Attention(False, heads, 0, 0, self.kv_q, True), Attention(True, heads, 0, 0, self.kv_q, True))
            g = [grid(self.backend, o) for o in module] if self.engine == "vllm" else [None]  # vLLM's own module rows
            if all(x is not None for x in g):
                return at2(g[1], prompts, prompt) + at2(g[0], decode, dec_len)  # each 0 where it has no rows
            proj = self.mla_projections(heads, T)
            ops = (Attention(False, heads, 0, 0, self.kv_q), Attention(True, heads, 0, 0, self.kv_q))
        g = [grid(self.backend, o) for o in ops]
        if any(p is None for p in proj) or any(x is None for x in g):
            return None
        return sum(proj) + at2(g[1], prompts, prompt) + at2(g[0], decode, dec_len)

    def mla_projections(self, heads: int, T) -> list:
        """MLA's projections as the engines run them (SGLang's op list): the down-projection of q and the
        latent KV, q's up-projection, the absorbed BMMs before and after the kernel, o; one GEMM of all
        the rank's projection weights where the model gives no MLA shapes."""
        m, q = self.model, self.dense_q
        if not m.mla:
            return [self.gemm(self.rank.attn_weights // m.D, m.D, q, T)]
        q_lora, kv_lora, nope, rope, v = m.mla
        bmm = "bfloat16" if q == "bfloat16" else "fp8"
        down = self.gemm((q_lora or heads * (nope + rope)) + kv_lora + rope, m.D, q, T)
        up = [self.gemm(heads * (nope + rope), q_lora, q, T)] if q_lora else []
        bmms = [None if (c := curve(self.backend, MlaBmm(heads, pre, bmm))) is None else at(c, T)
                for pre in (True, False)]
        return [down, *up, *bmms, self.gemm(m.D, heads * v, q, T)]

    def experts(self, rows_q, low_rows_q=None) -> np.ndarray | None:
        """[..., R] seconds of each rank's fused MoE on its own rows (the table at N = rows · R / K).
        A hot/low mix (hot_q set) is two fused MoEs, one per format, as an engine runs one kernel per
        weight format (`mixed_experts`); low_rows_q: of rows_q, those on low-format slots."""
        m = self.model
        if self.expert_q is None:
            return None
        low = self._expert_curve(self.expert_q)
        if self.hot_q is None:
            return None if low is None else at(low, np.asarray(rows_q) * self.ep / m.K)
        hot = self._expert_curve(self.hot_q)
        if low is None or hot is None or low_rows_q is None:
            return None
        rows_q = np.asarray(rows_q, dtype=np.float64)
        low_rows = np.minimum(np.asarray(low_rows_q, dtype=np.float64), rows_q)
        return mixed_experts(hot, low, rows_q - low_rows, low_rows, self.hot_share, self.ep / m.K)

    def experts_measured(self) -> bool:
        """Whether the tables price this deployment's expert op (every format it holds has an entry)."""
        if self.expert_q is None or self._expert_curve(self.expert_q) is None:
            return False
        return self.hot_q is None or self._expert_curve(self.hot_q) is not None

    def _expert_curve(self, quant: str) -> np.ndarray | None:
        m = self.model
        op = Moe(m.D, m.I, m.K, m.E, self.etp, self.ep, quant)
        c = curve(self.backend, op)  # read first: the package reports its row sources once a table was read
        rows = getattr(self.backend, "moe_rows", None)  # which version's rows price op (moe_rows.py)
        backend, note = rows(op) if rows is not None and c is not None else (self.backend, None)
        c = c if backend is self.backend else curve(backend, op)
        if c is not None and note:  # named in the experts' source (the phase keeps its first label)
            self.sources.setdefault("experts", f"{self.backend.label} ({note})")
        return c

    def mlp(self, inter: int, tokens) -> np.ndarray | None:
        """A dense (or shared-expert) MLP of one rank's intermediate size: gate/up + down GEMMs."""
        up, down = self.gemm(2 * inter, self.model.D, self.dense_q, tokens), self.gemm(self.model.D, inter,
                                                                                       self.dense_q, tokens)
        return None if up is None or down is None else up + down

    def dispatch(self, tokens, prefill) -> tuple[np.ndarray, np.ndarray] | None:
        """(dispatch s, combine s) of one MoE layer at the largest rank's tokens (expert parallelism
        with attention data-parallel ranks): DeepEP's tables (low-latency kernels in decode steps,
        high-throughput in steps with a prompt) where measured at this EP size and node count, else the
        engine's own dispatch table, else None. prefill: bool, the step has prompt tokens."""
        m, q = self.model, self.expert_q or "bfloat16"
        deep = self.deepep_curves()
        if deep is not None:
            ll_d, ll_c, ht_d, ht_c = deep
            return (np.where(prefill, at(ht_d, tokens), at(ll_d, tokens)),
                    np.where(prefill, at(ht_c, tokens), at(ll_c, tokens)))
        pre, post = (curve(self.backend, Dispatch(m.D, m.K, m.E, self.ep, side, q, self.engine))
                     for side in (True, False))
        return None if pre is None or post is None else (at(pre, tokens), at(post, tokens))

    def deepep_curves(self) -> list | None:
        """DeepEP's [low-latency dispatch, combine, high-throughput dispatch, combine] curves at this EP
        size and node count; across nodes without rows there, the one-node rows of a full node (EP =
        GPUs per node, as AIConfigurator substitutes them: its `a2a_covers_parallel`), the source saying
        so (the dispatch / combine phases' label is set here, before `phase_costs.measured_a2a` notes
        them). None where neither is measured."""
        m = self.model
        deep = [curve(self.backend, DeepEP(ll, side, m.D, m.K, m.E, self.ep, self.nodes))
                for ll in (True, False) for side in (True, False)]
        if all(c is not None for c in deep):
            return deep
        full = self.per_node
        if self.nodes <= 1:
            return None
        deep = [curve(self.backend, DeepEP(ll, side, m.D, m.K, m.E, full, 1))
                for ll in (True, False) for side in (True, False)]
        if not all(c is not None for c in deep):
            return None
        for phase in ("dispatch", "combine"):
            self.sources.setdefault(phase, f"{self.backend.label} (DeepEP EP-{full} one-node rows for EP-{self.ep} on "
                                           f"{self.nodes} nodes: no {self.nodes}-node rows; AIConfigurator "
                                           "substitutes them the same way)")
        return deep

    def tp_link(self, G: int, kind: str, act_bytes: int) -> tuple[float, float | None, float] | None:
        """(α s, gather α, link B/s) of the TP group's all-reduces (tp.tp_collectives' ring form) fitted to
        the all-reduce table at the step kind's payloads (decode 8 → 256 tokens, prefill 1k → 8k)."""
        c = curve(self.backend, AllReduce(self.model.D, G))
        if c is None:
            return None
        lo, hi = (8, 256) if kind == "decode" else (1024, 8192)
        l1, l2 = at(c, np.array([lo, hi]))
        slope = (l2 - l1) / (hi - lo)  # s per token
        if slope <= 0:
            return None
        bw = 2 * (G - 1) / G * self.model.D * act_bytes / slope
        alpha = max(float(l1 - slope * lo), 0.0)
        for phase in ("tp_allreduce", "tp_embed", "tp_gather"):  # priced from the table's fit: all measured
            self.seconds[phase] = [1.0, 1.0]
            self.sources[phase] = f"{self.backend.label} (all-reduce fit)"
        return alpha, None, bw

    def note(self, phase: str, measured_s, total_s, source: str) -> None:
        """Count a phase's priced seconds (measured part, all) and its source."""
        acc = self.seconds.setdefault(phase, [0.0, 0.0])
        acc[0] += float(np.sum(measured_s))
        acc[1] += float(np.sum(total_s))
        self.sources.setdefault(phase, source)

    def share_of(self, phase: str) -> float:
        acc = self.seconds.get(phase)
        return acc[0] / acc[1] if acc and acc[1] > 0 else 0.0


def bind(choice: TableChoice | None, model, rank, d, prec, ranks_per_node: int = 8) -> Measured | None:
    """The measured ops of deployment d (None: the roofline prices everything). model: the whole
    SimModel (its weight_format fp8: the checkpoint's block-wise fp8), rank: one rank's shapes."""
    if choice is None or choice.backend is None:
        return None
    fp8_checkpoint = model.weight_format == "fp8"
    block = fp8_checkpoint or choice.engine == "sglang"  # sglang's fp8 kernels are block-wise
    fp8 = "fp8_block" if block else "fp8"
    dense_q = fp8 if prec.dense_b < 2 else "bfloat16"
    low, hot = d.quant_low_format, d.quant_hot_fraction
    full = fp8 if fp8_checkpoint else "bfloat16"  # the checkpoint's own expert format
    mixed = low != "none" and 0 < hot < 1
    if low == "none" or hot >= 1:
        expert_q = full
    else:  # int8 experts: no table holds them (the roofline prices them; study/engine_formats.py)
        expert_q = {"fp8": fp8, "int4": "int4_wo"}.get(low)
    return Measured(choice.backend, model, rank, d.tp_size, d.expert_tp_size, d.ep_size, dense_q, expert_q,
                    "fp8" if prec.kv_b < 2 else "bfloat16", engine=choice.engine,
                    nodes=max(1, -(-d.ep_size // ranks_per_node)), per_node=ranks_per_node,
                    hot_q=full if mixed else None,
                    hot_share=hot_share(hot, model.E) if mixed else 0.0)


def sources_of(meas: Measured | None) -> dict[str, str]:
    return {} if meas is None else dict(meas.sources)


def trial_figures(choice: TableChoice | None, meas: Measured | None, phases: dict) -> dict:
    """A trial's cost-source figures (Metrics.detail): `cost_source` (the tables' label, or
    `roofline (unmeasured)`), `measured_share` (of the step seconds, the share priced from
    measurements: each phase line × the measured share of that phase's priced seconds) and
    `op_sources` (phase → what priced it). Nothing where no tables were chosen (this-machine)."""
    if choice is None:  # not GPU hardware (this-machine: its own calibration prices it)
        return {}
    if meas is None:
        return {"cost_source": choice.label, "measured_share": 0.0, "op_sources": {}, "cost_note": choice.note}
    derived = {"straggler_wait": "experts", "overlap_hidden": "experts"}  # lines that are a measured phase's
    total = sum(float(np.sum(v)) for v in phases.values() if v is not None)
    measured = sum(float(np.sum(v)) * meas.share_of(derived.get(p, p)) for p, v in phases.items() if v is not None)
    return {"cost_source": meas.backend.label, "measured_share": measured / total if total > 0 else 0.0,
            "op_sources": sources_of(meas), "cost_note": choice.note}


def cost_sentence(detail: dict | None) -> str:
    """Which tables priced a trial, in words (the report, the winner's recipe and launch files)."""
    detail = detail or {}
    source = detail.get("cost_source", UNMEASURED)
    if source == UNMEASURED:
        note = detail.get("cost_note") or UNMEASURED
        return f"GPU op costs: {note}" if note != UNMEASURED else f"GPU op costs: {UNMEASURED}"
    ops = ", ".join(sorted(p for p, s in (detail.get("op_sources") or {}).items() if s.startswith(source)))
    return (f"GPU op costs: {100 * detail.get('measured_share', 0.0):.0f} % of the step time from measured tables "
            f"({source}: {ops}); the rest roofline (unmeasured)")
