"""Triton kernels for the MoE phases, installed as `moetune.kernels`.

One file per kernel (router, align, fused_experts, combine), each with a plain-torch twin of the
same signature in `reference.py`. Importing this package imports nothing heavy: the kernel modules
import triton themselves, so only code that launches a kernel pays for it.

`cpu/` holds the CPU decode kernels (numba, compiled on first call), same rule: twins beside them.
"""
