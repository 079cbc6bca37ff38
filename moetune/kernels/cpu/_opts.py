"""The numba options every CPU kernel compiles with: cached on disk, fp32 fastmath (the k reductions
reassociated into SIMD lanes), no GIL, numpy's error model (no division checks). Importing this module
(every kernel module does, before its first `@njit`) installs the package's cache locators (`_cache`:
a kernel's disk cache is keyed on every kernel source, so it cannot go stale)."""

from moetune.kernels.cpu._cache import install

install()

CACHED = dict(cache=True, nogil=True)  # the bare options (`prefetch_row`)
OPTS = dict(CACHED, fastmath=True, error_model="numpy")
