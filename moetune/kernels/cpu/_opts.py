"""The numba options every CPU kernel compiles with: cached on disk, fp32 fastmath (the k reductions
reassociated into SIMD lanes), no GIL, numpy's error model (no division checks)."""

OPTS = dict(cache=True, fastmath=True, nogil=True, error_model="numpy")
