"""CPU kernels for decode-shaped matmuls (numba JIT), each with a plain-torch twin.

  linear(x, w) / linear_ref            small-M x @ W.T, W fp32 | int8 | int4   (`linear.py`)
  decode_attention / ..._ref          one query token per sequence over the paged KV cache (`attention.py`)
  fused_experts_cpu / ..._ref          grouped w13 → SiLU·mul → w2 over sorted rows (`experts.py`)
  select_topk, permute_rows, unpermute_rows   the MoE layer's routing bookkeeping (`routing.py`;
                                       twins: the torch phases in `moetune.moe`)
  rms_norm, rope_                      RMSNorm and rotary, one call each (`rowwise.py`; twins:
                                       `model.norm.RMSNorm`, `model.rope.Rotary.apply`)
  quantize_int8 / quantize_int4 / dequantize_*                                  (`formats.py`)

Importing this package imports torch only; numba is imported and each kernel compiled on its
first call (then cached on disk, so later processes only load it).
"""

from moetune.kernels.cpu import isa
from moetune.kernels.cpu.attention import decode_attention, decode_attention_ref
from moetune.kernels.cpu.experts import fused_experts_cpu, fused_experts_cpu_ref
from moetune.kernels.cpu.formats import (INT4_GROUPS, dequantize, dequantize_int4, dequantize_int8,
                                         quantize_int4, quantize_int8)
from moetune.kernels.cpu.linear import linear, linear_ref
from moetune.kernels.cpu.runtime import set_threads

__all__ = ["INT4_GROUPS", "isa", "decode_attention", "decode_attention_ref", "dequantize", "dequantize_int4",
           "dequantize_int8", "fused_experts_cpu", "fused_experts_cpu_ref", "linear", "linear_ref", "quantize_int4",
           "quantize_int8", "set_threads"]
