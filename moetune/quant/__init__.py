"""Per-expert precision: the formats an expert can take and the policy that picks one per expert.

  names.py    format names, torch-free; the kernels' int4 group sizes reconciled
  formats.py  format names (fp32 bf16 fp16 fp8 int8 int4-g32/g64/g128) → pack / unpack, over the
              kernels' own `PackedWeight` containers and quantisers (nothing re-implemented here)
  table.py    PrecisionTable: a format per MoE layer × expert; from a policy (hot fraction by
              profiled load), a JSON table file, or one format for all
"""
