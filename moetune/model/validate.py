"""Checkpoint validation before any tensor is read: config values, safetensors headers, tokenizer files.

Only headers are read (the 8-byte length + JSON of each safetensors file), never tensor data, so
this is cheap even for a checkpoint of hundreds of GB. Every tensor the `ModelSpec` implies is
checked for presence, shape and a floating dtype; the first mismatch is one `CheckpointError` that
names the tensor (and file), the expected and the found value.

Independent of how the loader later reads tensors: it accepts either expert layout (per-expert
`experts.{e}.*_proj.weight` or fused `experts.gate_up_proj` / `experts.down_proj`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import CheckpointError
from moetune.model.naming import TensorNames
from moetune.spec import GQASpec, ModelSpec

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
TOKENIZER_FILES = "tokenizer.json, tokenizer.model, or vocab.json + merges.txt"

# config.json keys that must be whole numbers ≥ 1 (counts and sizes) or ≥ 0 when present
_POSITIVE_INTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts", "num_local_experts",
                  "n_routed_experts", "num_experts_per_tok", "max_position_embeddings", "decoder_sparse_step",
                  "n_group", "topk_group", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
_NON_NEGATIVE_INTS = ("shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace",
                      "sliding_window", "qk_nope_head_dim")
_POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta", "routed_scaling_factor", "clip_qkv")


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    file: str


# --- config.json -------------------------------------------------------------------------------

def read_spec(model_dir: Path) -> ModelSpec:
    """config.json → ModelSpec, every mistake a `CheckpointError` naming the file (no torch needed)."""
    from moetune.model.adapters import spec_from_config

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory '{model_dir}' does not exist; pass --model DIR or a bundled name")
    config_path = model_dir / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"'{model_dir}' has no config.json; point --model at a Hugging Face checkpoint dir")
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise CheckpointError(f"cannot read {config_path}: {exc}") from None
    check_config(cfg, config_path)
    return spec_from_config(cfg)


def check_config(cfg: object, path: Path) -> None:
    """Raw config.json values: a mapping, numbers where numbers belong, in range."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} must hold a JSON object, not {type(cfg).__name__}")
    for key in _POSITIVE_INTS + _NON_NEGATIVE_INTS:
        value = cfg.get(key)
        if value is None:
            continue
        low = 1 if key in _POSITIVE_INTS else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CheckpointError(f"{path}: '{key}' is {json.dumps(value)}; expected a whole number >= {low}")
    for key in _POSITIVE_FLOATS:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise CheckpointError(f"{path}: '{key}' is {json.dumps(value)}; expected a finite number > 0")
    for key in ("rope_parameters", "rope_scaling"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise CheckpointError(f"{path}: '{key}' must be an object")


def check_spec(spec: ModelSpec) -> None:
    """Values that parse but cannot work together."""
    where = "config.json"
    if spec.hidden_act != "silu":
        raise CheckpointError(f"{where}: hidden_act '{spec.hidden_act}' is not supported (only silu)")
    if not spec.layers:
        raise CheckpointError(f"{where}: num_hidden_layers must be at least 1")
    att = spec.attention
    if isinstance(att, GQASpec):
        if att.num_heads % att.num_kv_heads:
            raise CheckpointError(f"{where}: num_attention_heads={att.num_heads} is not a multiple of "
                                  f"num_key_value_heads={att.num_kv_heads}")
        if att.head_dim % 2:
            raise CheckpointError(f"{where}: head dim {att.head_dim} must be even for rotary embeddings")
    elif att.qk_rope_head_dim % 2:
        raise CheckpointError(f"{where}: qk_rope_head_dim={att.qk_rope_head_dim} must be even")
    if not (math.isfinite(spec.rope.theta) and spec.rope.theta > 0 and math.isfinite(spec.rope.factor)
            and spec.rope.factor > 0):
        raise CheckpointError(f"{where}: rope theta {spec.rope.theta} and factor {spec.rope.factor} must be > 0")
    for name, ids in (("bos_token_id", (spec.bos_token_id,) if spec.bos_token_id is not None else ()),
                      ("eos_token_id", spec.eos_token_ids)):
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < spec.vocab_size]
        if bad:
            raise CheckpointError(f"{where}: {name} {bad[0]} is outside the vocabulary of {spec.vocab_size}")
    if spec.moe_layers and spec.moe.intermediate_size < 1:
        raise CheckpointError(f"{where}: moe intermediate size must be at least 1")
    for layer in spec.layers:
        if not layer.is_moe and layer.dense_intermediate < 1:
            raise CheckpointError(f"{where}: layer {layer.index} is dense but intermediate_size is missing or 0")


# --- safetensors headers -----------------------------------------------------------------------

def read_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor name → dtype, shape of one safetensors file; truncated or corrupt files are named."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(f"weights file '{path}' is truncated ({size} bytes, no safetensors header)")
            n = int.from_bytes(head, "little")
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise CheckpointError(f"weights file '{path}' is truncated or not safetensors "
                                      f"(header of {n} bytes claimed, file has {size})")
            raw = fh.read(n)
    except OSError as exc:
        raise CheckpointError(f"cannot read weights file '{path}': {exc.strerror}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        return _tensor_infos(header, size - 8 - n, path)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"weights file '{path}' is corrupt (bad safetensors header: {exc})") from None


def _tensor_infos(header: dict, data_bytes: int, path: Path) -> dict[str, TensorInfo]:
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if dtype not in DTYPE_BYTES or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"tensor '{name}' has dtype {dtype!r} and shape {list(shape)}")
        if end - begin != math.prod(shape) * DTYPE_BYTES[dtype] or begin < 0:
            raise ValueError(f"tensor '{name}' spans bytes {begin}..{end}, which does not fit its shape")
        if end > data_bytes:
            raise CheckpointError(f"weights file '{path}' is truncated: tensor '{name}' ends at data byte {end} "
                                  f"but the file holds {data_bytes}")
        out[name] = TensorInfo(dtype, shape, path.name)
    return out


def checkpoint_tensors(model_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor the loader can see: through the shard index if present, else all *.safetensors."""
    index_path = model_dir / INDEX_FILE
    if index_path.exists():
        weight_map = _read_index(index_path)
        headers = {}
        for file in sorted(set(weight_map.values())):
            if not (model_dir / file).is_file():
                raise CheckpointError(f"shard '{file}' listed in {INDEX_FILE} is missing from {model_dir}")
            headers[file] = read_header(model_dir / file)
        for name, file in weight_map.items():
            if name not in headers[file]:
                raise CheckpointError(f"{INDEX_FILE} puts tensor '{name}' in '{file}', which does not contain it")
        return {name: headers[file][name] for name, file in weight_map.items()}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in {model_dir}; save the model with save_pretrained")
    tensors: dict[str, TensorInfo] = {}
    for path in files:
        tensors.update(read_header(path))
    return tensors


def _read_index(path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError("weight_map is not an object of file names")
        return weight_map
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is corrupt ({type(exc).__name__}: {exc}); re-save the checkpoint") from None


# --- expected tensors --------------------------------------------------------------------------

def expected_tensors(spec: ModelSpec, present: set[str], quant=None, dense: str | None = None) -> dict[str, tuple]:
    """Name → (shape, required[, allowed dtypes]). Optional entries (biases, tied lm_head) are checked
    only if present; without allowed dtypes a float type is expected. `quant`: the precision table of a
    `moetune quantize` checkpoint (its experts are packed, `model/quant_checkpoint.py`); `dense`: the
    format its dense projections are packed in."""
    V, D, n = spec.vocab_size, spec.hidden_size, TensorNames(spec.model_type)
    want: dict[str, tuple[tuple[int, ...], bool]] = {
        "model.embed_tokens.weight": ((V, D), True),
        "lm_head.weight": ((V, D), not spec.tie_word_embeddings),
        "model.norm.weight": ((D,), True),
    }
    for layer in spec.layers:
        i = layer.index
        want[n.layer(i) + "input_layernorm.weight"] = ((D,), True)
        want[n.layer(i) + "post_attention_layernorm.weight"] = ((D,), True)
        want.update(_attention(spec, i))
        if layer.is_moe:
            want.update(_moe(spec, n, i, present, quant))
        else:
            want.update(_mlp(n.dense_mlp(i), D, layer.dense_intermediate))
    if dense is not None:
        from moetune.model.quant_checkpoint import expected_dense

        want = expected_dense(want, dense)
    return want


def _linear(prefix: str, out: int, inp: int) -> dict:
    return {prefix + ".weight": ((out, inp), True), prefix + ".bias": ((out,), False)}


def _mlp(prefix: str, D: int, inter: int) -> dict:
    return {**_linear(prefix + "gate_proj", inter, D), **_linear(prefix + "up_proj", inter, D),
            **_linear(prefix + "down_proj", D, inter)}


def _attention(spec: ModelSpec, i: int) -> dict:
    p, D, a = f"model.layers.{i}.self_attn.", spec.hidden_size, spec.attention
    if isinstance(a, GQASpec):
        q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        want = {**_linear(p + "q_proj", q, D), **_linear(p + "k_proj", kv, D), **_linear(p + "v_proj", kv, D),
                **_linear(p + "o_proj", D, q)}
        if a.qk_norm == "per_head":
            want.update({p + "q_norm.weight": ((a.head_dim,), True), p + "k_norm.weight": ((a.head_dim,), True)})
        elif a.qk_norm == "full":
            want.update({p + "q_norm.weight": ((q,), True), p + "k_norm.weight": ((kv,), True)})
        return want
    H, q_out = a.num_heads, a.num_heads * a.qk_head_dim
    want = {**_linear(p + "kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, D),
            p + "kv_a_layernorm.weight": ((a.kv_lora_rank,), True),
            **_linear(p + "kv_b_proj", H * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank),
            **_linear(p + "o_proj", D, H * a.v_head_dim)}
    if a.q_lora_rank is not None:
        want.update({**_linear(p + "q_a_proj", a.q_lora_rank, D), p + "q_a_layernorm.weight": ((a.q_lora_rank,), True),
                     **_linear(p + "q_b_proj", q_out, a.q_lora_rank)})
    else:
        want.update(_linear(p + "q_proj", q_out, D))
    return want


def _moe(spec: ModelSpec, n: TensorNames, i: int, present: set[str], quant=None) -> dict:
    m, D = spec.moe, spec.hidden_size
    E, inter = m.num_experts, m.intermediate_size
    want = {n.router_weight(i): ((E, D), True)}
    if m.router.has_selection_bias:
        want[n.router_bias(i)] = ((E,), True)
    fused_w13, fused_w2 = n.fused_experts(i)
    if quant is not None:
        from moetune.model.quant_checkpoint import expected_quantized

        want.update(expected_quantized(spec, n, i, quant.layer(i)))
    elif fused_w13 in present or fused_w2 in present:
        want.update({fused_w13: ((E, 2 * inter, D), True), fused_w2: ((E, D, inter), True)})
    else:
        for e in range(E):
            want.update({n.expert(i, e, "gate"): ((inter, D), True), n.expert(i, e, "up"): ((inter, D), True),
                         n.expert(i, e, "down"): ((D, inter), True)})
    if m.shared_intermediate_size:
        want.update(_mlp(n.shared(i), D, m.shared_intermediate_size))
        if m.shared_gate:
            want[n.shared_gate(i)] = ((1, D), True)
    return want


# --- tokenizer files ---------------------------------------------------------------------------

def check_tokenizer(model_dir: Path, vocab_size: int) -> None:
    has_json = (model_dir / "tokenizer.json").is_file()
    has_spm = (model_dir / "tokenizer.model").is_file()
    has_bpe = (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file()
    if not (has_json or has_spm or has_bpe):
        raise CheckpointError(f"'{model_dir}' has no tokenizer files ({TOKENIZER_FILES}); "
                              "copy them from the original checkpoint")
    for name in ("tokenizer_config.json", "tokenizer.json"):
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CheckpointError(f"tokenizer file '{path}' is corrupt ({exc}); copy it from the original "
                                  "checkpoint") from None
        if name == "tokenizer.json":
            top = _max_token_id(data)
            if top is not None and top >= vocab_size:
                raise CheckpointError(f"tokenizer file '{path}' has token id {top}, outside the model's "
                                      f"vocab_size {vocab_size}")


def _max_token_id(data: object) -> int | None:
    """Largest id in a tokenizers JSON (BPE/WordPiece vocab dict, Unigram list, added tokens)."""
    if not isinstance(data, dict):
        return None
    ids: list[int] = []
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
    if isinstance(vocab, dict):
        ids += [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):
        ids.append(len(vocab) - 1)
    ids += [t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
    return max(ids) if ids else None


# --- the one entry point -----------------------------------------------------------------------

def validate_checkpoint(model_dir: Path | str, spec: ModelSpec) -> dict[str, TensorInfo]:
    """Raise `CheckpointError` for the first problem; return the tensors found (headers only)."""
    model_dir = Path(model_dir)
    check_spec(spec)
    tensors = checkpoint_tensors(model_dir)
    from moetune.model.quant_checkpoint import dense_format, read_block, read_quantization

    quant, dense = read_quantization(model_dir, spec), dense_format(read_block(model_dir))
    for name, (shape, required, *dtypes) in expected_tensors(spec, set(tensors), quant, dense).items():
        found = tensors.get(name)
        if found is None:
            if name.endswith(".scales"):
                raise CheckpointError(f"quantized checkpoint in {model_dir} lacks the scales '{name}' of a packed "
                                      "weight; re-run moetune quantize")
            if required:
                raise CheckpointError(f"tensor '{name}' is missing from the checkpoint in {model_dir}")
            continue
        if found.shape != shape:
            raise CheckpointError(f"tensor '{name}' in {found.file} has shape {list(found.shape)}; config.json "
                                  f"implies {list(shape)}")
        allowed = dtypes[0] if dtypes else FLOAT_DTYPES
        if found.dtype not in allowed:
            what = "a float type" if not dtypes else "its packed format"
            raise CheckpointError(f"tensor '{name}' in {found.file} has dtype {found.dtype}; expected {what} "
                                  f"({', '.join(allowed)})")
    check_tokenizer(model_dir, spec.vocab_size)
    return tensors
