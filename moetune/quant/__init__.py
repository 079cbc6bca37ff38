"""Weight formats for experts (bf16/fp16/fp32, fp8 e4m3, int8 per-channel, int4 group-wise).

Not built yet: the reference packing/dequantisation lives in `moetune.kernels.quant_formats`
(the Triton GEMM's formats); per-expert precision in the ExpertStore comes with the quantization work.
"""
