"""What `moetune bench` timed, part by part: the format of each part's weights and what a decode
step reads of each (the bytes-per-token column's breakdown).

  experts        the routed experts' formats (the PrecisionTable's counts; the load dtype without one)
  attention      QKV / o (MLA: q/kv down, q up, o)          ┐
  dense_mlp      dense layers' MLPs                         │ model/dense_quant.py
  shared_expert  shared experts' MLPs                       │
  lm_head        the LM head (read whole by every step)     ┘
  router, embedding, norms   always the load dtype (the embedding's rows are gathered, not streamed)
"""

from __future__ import annotations

from moetune.model.dense_quant import dense_precision
from moetune.model.transformer import MoETransformer


def model_precision(model: MoETransformer) -> dict[str, str]:
    """Part → its format ('int8', 'int4-g64', 'fp32', or a mix such as 'int4-g64 448 · fp32 64')."""
    dtype = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(model.dtype),
                                                                                           str(model.dtype))
    table = getattr(model, "precision", None)
    if table is None:
        experts = dtype
    else:
        counts = sorted(table.counts().items(), key=lambda kv: -kv[1])
        experts = counts[0][0] if len(counts) == 1 else " · ".join(f"{n} {c}" for n, c in counts)
    return {"experts": experts, **dense_precision(model), "router": dtype, "embedding": dtype}


def precision_line(model: MoETransformer) -> str:
    return "precision: " + " · ".join(f"{part} {fmt}" for part, fmt in model_precision(model).items())
