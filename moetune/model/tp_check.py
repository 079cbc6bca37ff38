"""Whether a model can be split tensor-parallel G ways: one `TPError` line per reason (torch-free,
so commands check before loading anything)."""

from __future__ import annotations

from moetune.errors import MoetuneError
from moetune.spec import GQASpec, ModelSpec


class TPError(MoetuneError):
    """A tensor-parallel size this model cannot be split by."""


def check_tp(spec: ModelSpec, tp_size: int, expert_tp_size: int) -> None:
    """Every reason this model cannot be split tp_size / expert_tp_size ways, as one TPError line."""
    if tp_size > 1:
        _check_attention(spec, tp_size)
        _divides(tp_size, spec.vocab_size, "the vocabulary size", "--tp-size")
        for layer in spec.layers:
            if not layer.is_moe:
                _divides(tp_size, layer.dense_intermediate, f"layer {layer.index}'s dense intermediate size", "--tp-size")
    if expert_tp_size > 1:
        _divides(expert_tp_size, spec.moe.intermediate_size, "the expert intermediate size", "--expert-tp-size")
        if spec.moe.shared_intermediate_size:
            _divides(expert_tp_size, spec.moe.shared_intermediate_size, "the shared expert's intermediate size",
                     "--expert-tp-size")


def _check_attention(spec: ModelSpec, G: int) -> None:
    att = spec.attention
    _divides(G, att.num_heads, "the attention heads", "--tp-size")
    if isinstance(att, GQASpec):
        kv = att.num_kv_heads
        if kv % G and G % kv:
            raise TPError(f"--tp-size {G} neither divides nor is a multiple of the model's {kv} KV heads")


def _divides(G: int, n: int, what: str, flag: str) -> None:
    if n % G:
        raise TPError(f"{flag} {G} does not divide {what} ({n})")
