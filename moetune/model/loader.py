"""Load a Hugging Face MoE checkpoint directory into a MoETransformer (our math, their files)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from moetune.experts.store import ExpertWeights, ResidentExpertStore
from moetune.kernels.cpu import linear as cpu_linear
from moetune.kernels.cpu.formats import in_features
from moetune.kernels.cpu.q4r import repack_ahead
from moetune.kernels.quant_formats import PackedWeight
from moetune.model.attention import GQAAttention
from moetune.model.checkpoint import Checkpoint, checkpoint_at, mtp_config
from moetune.model.fused_decode import FusedDecode
from moetune.model.hugepages import to_huge_pages
from moetune.model.linear import SMALL_M, Linear
from moetune.model.mla import MLAttention
from moetune.model.mlp import GatedMLP
from moetune.model.mtp import MTPModule
from moetune.model.naming import TensorNames
from moetune.model.norm import RMSNorm
from moetune.model.tp_norm import split_qk_norm
from moetune.model.rope import Rotary
from moetune.spec import GQASpec, ModelSpec
from moetune.model.transformer import DecoderLayer, MoETransformer
from moetune.model.validate import read_spec  # noqa: F401 (re-exported, torch-free)
from moetune.model.quant_checkpoint import dense_format, read_block, read_quantization
from moetune.model.dense_quant import linear_weight, packed_weights, quantize_dense
from moetune.model.expert_tensors import read_experts, read_packed_layer
from moetune.experts.mixed import quantized_layer, quantized_slots
from moetune.quant.names import QuantError, check_backend, parse_name
from moetune.quant.table import PrecisionTable
from moetune.model.tp import TPComm, local_spec
from moetune.model.tp_experts import check_groups, shard_experts
from moetune.model.tp_shards import ShardedSource
from moetune.model.weights import WeightSource
from moetune.moe.backend import resolve_backend
from moetune.moe.dispatch import Dispatcher
from moetune.moe.layer import MoELayer, SharedExpert
from moetune.moe.placement import Placement


def load_model(
    model_dir: Path | str | Checkpoint,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    kernel_backend: str = "auto",
    placement: Placement | None = None,
    rank: int = 0,
    dispatcher: Dispatcher | None = None,
    precision: PrecisionTable | None = None,
    store_factory=None,
    tp: TPComm | None = None,
    dense: str | None = None,
) -> MoETransformer:
    """With a `placement`, this process is expert-parallel rank `rank`: its store holds only the
    rank's physical slots (a replica is a copy of its logical expert's weights) and every MoE layer
    sends token copies through `dispatcher`. Without one, every expert is local (R = 1).

    Expert precision: a checkpoint written by `moetune quantize` loads its packed experts as stored;
    `precision` (a recipe's quant section) packs a full-precision checkpoint's experts on load, and
    `dense` (its quant.dense) the dense projections (`model/dense_quant.py`).
    `store_factory(layers: dict[int, ExpertWeights], spec) -> ExpertStore` replaces the resident
    store (offloading). `model_dir`: a Checkpoint already checked (engine/target.py), or a directory,
    checked here (config.json and every safetensors header, before any tensor)."""
    checkpoint = model_dir if isinstance(model_dir, Checkpoint) else checkpoint_at(model_dir)
    model_dir, spec = checkpoint.model_dir, checkpoint.spec
    backend = resolve_backend(kernel_backend, torch.device(device))
    small_m = SMALL_M if backend.name == "cpu" and dtype == torch.float32 else 0  # CPU decode kernels
    if placement is not None:
        placement.check_for(spec.moe.num_experts, spec.moe_layers, placement.ep_size, spec.model_type)
    whole = WeightSource(model_dir, device, dtype)
    plan = tp.plan if tp is not None else None
    source = whole if plan is None else ShardedSource(whole, spec, plan)
    names = TensorNames(spec.model_type)
    stored = read_quantization(model_dir, spec)
    table = check_precision(stored, precision, spec, backend.name)
    check_dense(dense_format(read_block(model_dir)), dense, tp.plan.size if tp is not None else 1)
    if placement is not None and table is not None:  # a rank's slots of one format: one contiguous group
        placement = placement.by_format(table.formats)
    full, spec = spec, local_spec(spec, plan)  # `spec` from here on: the shapes this rank computes
    if plan is not None and plan.experts and table is not None:
        check_groups(table.names(), full.moe.intermediate_size, plan.size)
    layers = {i: _rank_experts(whole, source, names, full, spec, i, placement, rank, stored, table, plan)
              for i in spec.moe_layers}
    experts = store_factory(layers, spec) if store_factory is not None else ResidentExpertStore(layers)
    rotary = Rotary(spec.rope, torch.device(device), kernel=small_m > 0)
    layers = [_decoder_layer(source, names, spec, i, rotary, experts, backend, dispatcher, small_m, tp, full)
              for i in range(spec.num_layers)]
    experts.bind_routers(  # an offloading store predicts later layers' experts with their routers
        {layer.index: layer.mlp.predict for layer in layers if isinstance(layer.mlp, MoELayer)})
    embed = source.get("model.embed_tokens.weight")
    lm_head = embed if spec.tie_word_embeddings and not any(map(source.has, ("lm_head.weight", "lm_head.qweight"))) \
        else linear_weight(source, "lm_head.weight")
    norm = RMSNorm(source.get("model.norm.weight"), spec.rms_norm_eps, kernel=small_m > 0)
    model = MoETransformer(full, embed, layers, norm, lm_head, rotary, experts, small_m,
                           fused=FusedDecode() if small_m and tp is None else None, tp=tp, local=spec)
    if dense is not None:
        quantize_dense(model, dense)
    model.precision = table  # the routed experts' formats (None: the load dtype), for the profile summary
    model.model_dir = model_dir  # where its MTP layers are found (`load_mtp`)
    model.bytes_read = whole.bytes_read  # checkpoint bytes this process read (its slices under TP)
    if torch.device(device).type == "cpu":  # decode streams every weight: 2 MiB pages read faster
        resident = experts.tensors() if isinstance(experts, ResidentExpertStore) else []
        to_huge_pages(model.dense_tensors() + resident)
        if backend.name == "cpu":  # the int4 kernels read interleaved copies: made now, into 2 MiB pages too
            to_huge_pages(repack_ahead(packed_weights(model) + _packed_experts(experts)))
    if backend.name == "cpu":
        _warm_cpu_kernels(model, backend)
    return model


def _packed_experts(experts) -> list[PackedWeight]:
    """The resident routed experts' weights, every format group of every layer (none for an offloading store)."""
    if not isinstance(experts, ResidentExpertStore):
        return []
    return [w for i in experts.layers() for g in experts.weights(i).groups for w in (g.w13, g.w2)]


def _warm_cpu_kernels(model: MoETransformer, backend) -> None:
    """Compile the CPU kernels this model calls (or load them from numba's disk cache) at load time,
    not in the first request: a decode-shaped projection (its parallel kernel and the serial twin
    that small weights take), the experts of each weight format, and the fused decode layers."""
    if model.small_m:
        head = model.lm_head
        rows = PackedWeight(head.data[:2], head.scale[:2], head.fmt, head.group_size) \
            if isinstance(head, PackedWeight) else head[:2]
        for threads in (1, 2):
            cpu_linear(model.embed.new_zeros(1, model.spec.hidden_size), rows, threads=threads)
        for fmt in {(w.fmt, w.group_size): w for w in packed_weights(model)}.values():
            cpu_linear(model.embed.new_zeros(1, in_features(fmt)), fmt, threads=1)
    formats = set()
    for i in model.experts.layers():
        weights = model.experts.acquire(i, torch.zeros(1, model.spec.moe.router.top_k, dtype=torch.long))
        kinds = {(g.w13.fmt, g.w13.data.dtype) for g in weights.groups}
        if not kinds <= formats:
            formats |= kinds
            backend.warm(weights)
    if model.fused is not None:
        model.fused.warm(model)


def _linear(source: WeightSource, prefix: str, small_m: int = 0) -> Linear:
    return Linear(linear_weight(source, prefix + ".weight"), source.get_optional(prefix + ".bias"), small_m)


def _norm(source: WeightSource, name: str, eps: float, kernel: bool = False) -> RMSNorm:
    return RMSNorm(source.get(name), eps, kernel)


def _gated_mlp(source: WeightSource, prefix: str, small_m: int = 0,
               proj=("gate_proj", "up_proj", "down_proj")) -> GatedMLP:
    gate, up, down = (linear_weight(source, f"{prefix}{p}.weight") for p in proj)
    return GatedMLP(gate, up, down, small_m)


def _attention(source: WeightSource, spec: ModelSpec, i: int, rotary: Rotary, small_m: int = 0,
               tp: TPComm | None = None, full: ModelSpec | None = None):
    """full: the whole model's spec (`spec` is this rank's shapes under tensor parallelism)."""
    p = f"model.layers.{i}.self_attn."
    eps, kernel = spec.rms_norm_eps, small_m > 0
    if isinstance(spec.attention, GQASpec):
        has_norm = spec.attention.qk_norm != "none"
        qkv = Linear.fused([_linear(source, p + n) for n in ("q_proj", "k_proj", "v_proj")], small_m)
        q_norm = _norm(source, p + "q_norm.weight", eps, kernel) if has_norm else None
        k_norm = _norm(source, p + "k_norm.weight", eps, kernel) if has_norm else None
        split = None
        if spec.attention.qk_norm == "full" and tp is not None and tp.plan.attention:  # over the group's heads
            whole = (full or spec).attention
            split = split_qk_norm(i, q_norm, k_norm, tp, whole.num_heads, whole.num_kv_heads, whole.head_dim)
        return GQAAttention(i, spec.attention, qkv, _linear(source, p + "o_proj", small_m), q_norm, k_norm,
                            rotary, decode_kernel=small_m > 0, qk_split=split)
    mla = spec.attention
    lora = mla.q_lora_rank is not None
    return MLAttention(
        i, mla, spec.rope,
        _linear(source, p + "q_a_proj", small_m) if lora else None,
        _norm(source, p + "q_a_layernorm.weight", eps, kernel) if lora else None,
        _linear(source, p + ("q_b_proj" if lora else "q_proj"), small_m),
        _linear(source, p + "kv_a_proj_with_mqa", small_m),
        _norm(source, p + "kv_a_layernorm.weight", eps, kernel),
        _linear(source, p + "kv_b_proj"),  # only its halves W_UK, W_UV are used (einsums)
        _linear(source, p + "o_proj", small_m),
        rotary,
    )


def check_precision(stored: PrecisionTable | None, asked: PrecisionTable | None, spec: ModelSpec,
                    backend: str) -> PrecisionTable | None:
    """The table the experts end up in (None: plain, in the load dtype)."""
    if stored is not None and asked is not None:
        raise QuantError("this checkpoint is already quantized by moetune quantize; drop the recipe's quant "
                         "section or start from the full-precision checkpoint")
    table = stored or asked
    if table is None:
        return None
    table.check_for(list(spec.moe_layers), spec.moe.num_experts)
    for name in table.names():
        f = parse_name(name)
        f.check_dim(spec.hidden_size, "hidden_size")
        f.check_dim(spec.moe.intermediate_size, "moe intermediate size")
    check_backend(table.names(), backend)
    return table


def check_dense(stored: str | None, asked: str | None, group: int = 1) -> None:
    """Refuse packing dense projections twice, or over a tensor-parallel group of `group` > 1 ranks
    (its shards split float weights, not packed rows; engine/distributed.py asks before any rank starts)."""
    if stored is not None and asked is not None:
        raise QuantError(f"this checkpoint's dense projections are already {stored} (moetune quantize --dense); "
                         "drop the recipe's quant.dense or start from the full-precision checkpoint")
    if group > 1 and (stored or asked):
        what = f"quant.dense {asked}" if asked else f"this checkpoint's {stored} dense projections (quantize --dense)"
        raise QuantError(f"{what} over a tensor-parallel group of {group}: packed dense projections run on one "
                         "rank; use tp_size and expert_tp_size 1, or a checkpoint and recipe without dense packing")


def _rank_experts(whole: WeightSource, source, names: TensorNames, full: ModelSpec, spec: ModelSpec, i: int,
                  placement, rank: int, stored: PrecisionTable | None, table: PrecisionTable | None,
                  plan) -> ExpertWeights:
    """Layer i's experts on this rank. Split plain experts are read slice by slice (`source`);
    quantized ones are packed whole from `whole` and then sliced, keeping the one-rank scales."""
    if plan is None or not plan.experts or (stored is None and table is None):
        return _layer_experts(source, names, spec, i, placement, rank, stored, table)
    return shard_experts(_layer_experts(whole, names, full, i, placement, rank, stored, table), plan)


def _layer_experts(source: WeightSource, names: TensorNames, spec: ModelSpec, i: int, placement, rank: int,
                   stored: PrecisionTable | None, table: PrecisionTable | None) -> ExpertWeights:
    """Layer i's experts on this rank: under a placement (sorted by format when quantized) its slots."""
    held = None if placement is None else placement.rank_experts(i, rank)
    slots = None if placement is None else placement.slot_map(i, source.device)
    if stored is not None:
        return read_packed_layer(source, names, spec, i, stored.layer(i), held, slots)
    dense = read_experts(source, names, spec, i, placement, rank)
    if table is None:
        return dense
    if placement is None:
        return quantized_layer(dense.w13.data, dense.w2.data, table.layer(i))
    formats = table.layer(i)
    return quantized_slots(dense.w13.data, dense.w2.data, [formats[e] for e in held], slots)


def _moe(source: WeightSource, names: TensorNames, spec: ModelSpec, i: int, experts, backend, dispatcher,
         small_m: int = 0) -> MoELayer:
    shared = None
    if spec.moe.shared_intermediate_size:
        gate = source.get(names.shared_gate(i)) if spec.moe.shared_gate else None
        shared = SharedExpert(_gated_mlp(source, names.shared(i), small_m), gate)
    bias = source.get(names.router_bias(i), torch.float32) if spec.moe.router.has_selection_bias else None
    gate = source.get(names.router_weight(i), torch.float32)
    return MoELayer(i, spec.moe, gate, bias, experts, shared, backend, dispatcher)


def _decoder_layer(source, names: TensorNames, spec: ModelSpec, i: int, rotary: Rotary, experts, backend,
                   dispatcher=None, small_m: int = 0, tp: TPComm | None = None,
                   full: ModelSpec | None = None) -> DecoderLayer:
    p = names.layer(i)
    if spec.layers[i].is_moe:
        mlp = _moe(source, names, spec, i, experts, backend, dispatcher, small_m)
    else:
        mlp = _gated_mlp(source, names.dense_mlp(i), small_m)
    return DecoderLayer(
        index=i,
        attn_norm=_norm(source, p + "input_layernorm.weight", spec.rms_norm_eps, small_m > 0),
        attention=_attention(source, spec, i, rotary, small_m, tp, full),
        mlp_norm=_norm(source, p + "post_attention_layernorm.weight", spec.rms_norm_eps, small_m > 0),
        mlp=mlp,
        tp=tp,
    )


def load_mtp(model: MoETransformer, kernel_backend: str = "auto") -> MTPModule:
    """The first multi-token-prediction module of `model`'s checkpoint (model/mtp.py): layer index
    num_hidden_layers, counted by config.json's `num_nextn_predict_layers`, read from any of the
    directory's safetensors files, on the model's device and dtype. Its experts (an MoE block) are
    a resident store of their own; its attention writes layer 0 of the module's own cache.

    Under expert parallelism and tensor parallelism the module is replicated: every rank loads it
    whole (the full shapes, all its experts, the whole embedding and head) and runs it alone on
    the same tokens and hidden states, so every rank of a TP group drafts the same tokens. Its
    weights load in the formats the checkpoint stores: `moetune quantize --dense` packs its
    projections as it packs the target's; the expert policy covers the target's MoE layers only,
    so its experts stay in plain precision (a recipe's quant section packs the target alone)."""
    from moetune.model.adapters import spec_from_config

    model_dir = Path(model.model_dir)
    cfg = mtp_config(model_dir)  # the refusal without an MTP layer: one line
    spec, L = model.spec, model.spec.num_layers  # the whole model's shapes, on every rank
    layer = spec_from_config(dict(cfg, num_hidden_layers=L + 1)).layers[L]  # the family's dense / MoE rule
    mtp_spec = replace(spec, num_layers=L + 1, layers=(*spec.layers, layer))
    source, names = WeightSource(model_dir, model.device, model.dtype), TensorNames(spec.model_type)
    split = model.tp is not None and model.tp.plan.attention  # the target's embedding and head: vocab slices
    experts = ResidentExpertStore({L: _layer_experts(source, names, mtp_spec, L, None, 0, None, None)}
                                  if layer.is_moe else {})
    backend = resolve_backend(kernel_backend, model.device)
    block = _decoder_layer(source, names, mtp_spec, L, model.rotary, experts, backend, None, model.small_m,
                           None, mtp_spec)
    block.attention.layer = 0  # the module's own one-layer cache
    p, eps, kernel = f"model.layers.{L}.", spec.rms_norm_eps, model.small_m > 0
    embed = source.get(p + "embed_tokens.weight") if source.has(p + "embed_tokens.weight") \
        else source.get("model.embed_tokens.weight") if split else model.embed
    head = linear_weight(source, p + "shared_head.head.weight") if source.has(p + "shared_head.head.weight") \
        else _whole_head(source, spec) if split else model.lm_head
    return MTPModule(spec, embed, _norm(source, p + "enorm.weight", eps, kernel),
                     _norm(source, p + "hnorm.weight", eps, kernel), _linear(source, p + "eh_proj", model.small_m),
                     block, _norm(source, p + "shared_head.norm.weight", eps, kernel), head, model.rotary,
                     model.small_m)


def _whole_head(source: WeightSource, spec: ModelSpec):
    """The target's LM head read whole (its loaded one is this rank's vocab slice under TP)."""
    tied = spec.tie_word_embeddings and not any(map(source.has, ("lm_head.weight", "lm_head.qweight")))
    return source.get("model.embed_tokens.weight") if tied else linear_weight(source, "lm_head.weight")
