"""Dense-weight and KV-cache precision, and the compute rate of fp8 GEMMs (the serving engines'
`--quantization fp8` / `--kv-cache-dtype fp8` knobs, priced on GPU hardware).

| knob | what it changes | bytes | FLOPs |
|---|---|---|---|
| dense_format fp8 | attention projections, dense-layer and shared-expert MLPs (block-wise fp8 weights, as DeepSeek-V3's checkpoint and the engines' online fp8 store them; the embedding, LM head and router stay at the model dtype: neither engine's `--quantization fp8` nor DeepSeek-V3's checkpoint quantizes them) | 1 + 4/128 per weight (formats.py) | w8a8: at the hardware's fp8 rate (`fp8_flops`, 2× bf16 on H100/H200) |
| kv_format fp8 | the KV cache (GQA's K/V, MLA's latent) | 1 per element: twice the sequences in the same memory, half the bytes read per decode step | the attention scores stay at the activation dtype |
| quant_low_format fp8 (experts) | the cold experts | formats.py | w8a8 at the fp8 rate (the engines' fp8 MoE kernels) |

dense_format int8 / int4 (this-machine only: moetune's own `quant.dense`, study/machine_space.py; weight-only,
int8 one scale per output channel, int4 group 64; the engine packs the LM head too) store the dense
projections at those bytes (formats.py); their time is this machine's measured path (calibrate.py
`variant/dense-int8`: simulate.py prices a one-rank variant as fp32 × its own measured ratio).
int8 / int4 experts are weight-only (dequantised into the activation dtype's GEMM): bytes only.
A FLOP multiplier k < 1 scales a GEMM's FLOPs into activation-dtype FLOPs (the roofline divides by
one rate), so `--explain`'s flops of an fp8 GEMM are its bf16-equivalent FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.search.cost.formats import bytes_per_weight

DENSE_FORMATS = ("none", "fp8")  # on GPU hardware (the engines' --quantization fp8)
DENSE_QUANT = {"int8": "int8", "int4": "int4-g64"}  # on this-machine: knob value → the recipe's quant.dense
KV_FORMATS = ("none", "fp8")


@dataclass(frozen=True)
class Precision:
    dense_b: float  # bytes per dense projection weight
    dense_k: float  # FLOP multiplier of the dense projections' GEMMs (1 / fp8 speedup, else 1)
    kv_b: float  # bytes per KV-cache element
    expert_fp8_k: float  # FLOP multiplier of fp8 experts' GEMMs (1 / fp8 speedup; on the rows of fp8 slots only)

    @classmethod
    def plain(cls, b: int) -> "Precision":
        return cls(float(b), 1.0, float(b), 1.0)


def precision(d, hw, b: int) -> Precision:
    """The deployment's precision figures on hardware `hw` (activation / model dtype bytes `b`)."""
    k = 1.0 / hw.fp8_speedup()
    dense_fp8 = d.dense_format == "fp8"
    return Precision(bytes_per_weight(d.dense_format, b), k if dense_fp8 else 1.0,
                     1.0 if d.kv_format == "fp8" else float(b), k)  # which slots are fp8: simulate.Prepared.fp8_slot


def dense_quant(d) -> str | None:
    """The recipe's quant.dense of a deployment (None: the model dtype, or a GPU engine's fp8)."""
    return DENSE_QUANT.get(d.dense_format)


def dense_knob(dense: str | None) -> str:
    """A recipe's quant.dense → the dense_format knob value (int4-gG → int4)."""
    if not dense:
        return "none"
    return "int8" if dense == "int8" else "int4"
