"""The numba kernels, one namespace (imported lazily by `runtime.jit()`, never at package import).

All math is fp32 with fastmath (the k reductions are reassociated into SIMD lanes) or exact integer
sums scaled in fp32. Arrays are numpy views of C-contiguous torch tensors; the wrappers in
`linear.py` / `experts.py` check them. The kernels live in one module per idea:

  _jit_tiles          the fp32 register tiles (fp32 / int8 rows widened, int4 split in fp32)
  _jit_q8, _simd      the integer path: x rounded to int16 per block, int32 dot products
  _jit_linear         small-M linear over blocks of weight rows (fp32, int8, int4)
  _jit_experts        grouped fp32 / int8 experts (whole-expert lanes or column blocks)
  _jit_experts_int4   grouped int4 experts (int16 x, original layout)
  _jit_q4r, _simd_q4r int4 in the interleaved layout against int8 x (linear and experts)
  _jit_attention      paged decode attention
  _jit_panels         prefill of int8 / int4 weights: panels widened to fp32, x in int8 parts
  _jit_rows           RMSNorm, rotary, top-k, permute, unpermute
  _jit_layer          a decode layer strung into two calls (its own module: `runtime.jit_layer()`)

This module gathers the kernels the wrappers call and `serial`, their one-thread twins.
"""

from __future__ import annotations

from types import SimpleNamespace

from moetune.kernels.cpu._jit_attention import decode_attention, decode_attention_serial
from moetune.kernels.cpu._jit_experts import (active_experts, experts_dense, offsets_fit, plan_lanes, up_pairs1,
                                              up_pairs4, up_pairs8)
from moetune.kernels.cpu._jit_experts_int4 import experts_int4, experts_int4_serial
from moetune.kernels.cpu._jit_panels import combine_parts, dequant_int4_rows, dequant_int8_rows, x_parts_rows
from moetune.kernels.cpu._jit_q4r import experts_q4r, experts_q4r_serial, linear_q4r, linear_q4r_serial
from moetune.kernels.cpu._jit_linear import (linear_dense, linear_dense_serial, linear_int4, linear_int4_serial,
                                             linear_q4, linear_q4_serial, linear_q8, linear_q8_serial)
from moetune.kernels.cpu._jit_rows import permute_rows, rms_norm, rope_rotate_half, select_topk, unpermute_rows
from moetune.kernels.cpu._jit_tiles import GEMV_ROWS, gemv_rows1, gemv_rows4, gemv_rows8

__all__ = ["GEMV_ROWS", "GEMV_VARIANTS", "SERIAL", "active_experts", "combine_parts", "decode_attention", "decode_attention_serial", "dequant_int4_rows",
           "dequant_int8_rows", "experts_dense",
           "experts_int4", "experts_int4_serial", "experts_q4r", "experts_q4r_serial", "linear_dense", "linear_dense_serial", "linear_int4",
           "linear_int4_serial", "linear_q4", "linear_q4_serial", "linear_q4r", "linear_q4r_serial", "linear_q8", "linear_q8_serial", "offsets_fit",
           "permute_rows", "plan_lanes", "rms_norm", "rope_rotate_half", "select_topk", "serial", "unpermute_rows", "x_parts_rows"]

# The serial twins: the same work items, looped on the calling thread. `runtime.launch` hands these
# out for calls too small to wake a second thread, instead of switching numba's thread count to 1
# and back (three numba calls, ~25 µs on a decode step's flushed caches). experts_dense takes the
# thread count as an argument and needs no twin.
SERIAL = False
serial = SimpleNamespace(SERIAL=True, linear_dense=linear_dense_serial, linear_int4=linear_int4_serial,
                         linear_q8=linear_q8_serial, linear_q4=linear_q4_serial,
                         linear_q4r=linear_q4r_serial, experts_q4r=experts_q4r_serial,
                         experts_dense=experts_dense, experts_int4=experts_int4_serial,
                         decode_attention=decode_attention_serial)

# The one-x-row fp32 GEMV in each row count (`_jit_tiles.GEMV_ROWS` picks one per host; tests run each):
# rows per pass → (gemv_rows, the experts' up_pairs)
GEMV_VARIANTS = {1: (gemv_rows1, up_pairs1), 4: (gemv_rows4, up_pairs4), 8: (gemv_rows8, up_pairs8)}
