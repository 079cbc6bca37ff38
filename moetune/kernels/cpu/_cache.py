"""numba's disk cache for the CPU kernels, keyed on every kernel source (installed by `_opts`, so
before the first `@njit` of the package runs; numba only, never at package import).

numba stamps a kernel's cache index with its own source file (a hash of it), and the key of each
entry with the target CPU (name and features: one entry per instruction set, `isa`). A kernel that
calls kernels of another file holds their machine code too (numba links and inlines it), so after
that other file changed (an upgrade in place, a `git pull`), numba's stamp would still match and
hand back the old callee's code. Here every kernel of this package is stamped with one hash over
all of `moetune/kernels/cpu/*.py` instead, and with the host CPU's name (`_jit_tiles.GEMV_ROWS`,
frozen into the callers, follows the host, not the target a forced variant compiles for): a change
to any of them makes every kernel's index stale, and each kernel recompiles on its next first call
(numba then overwrites the index and reuses the data files' names). The cache stays where numba puts it (`NUMBA_CACHE_DIR`, else
`__pycache__` beside the source, else the user's cache directory). numba functions of other
modules keep numba's own locators.
"""

from __future__ import annotations

import functools
import hashlib
import os

from numba.core import caching

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def sources_hash() -> str:
    """sha256 over the names and bytes of every `.py` file of this directory (read once per process)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(HERE)):
        if name.endswith(".py"):
            with open(os.path.join(HERE, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


@functools.cache
def host_cpu() -> str:
    """The host CPU's name as LLVM gives it (e.g. znver4)."""
    from llvmlite import binding

    return binding.get_host_cpu_name()


class _PackageStamp:
    """A numba locator that takes this directory's functions only and stamps them with `sources_hash`."""

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.dirname(os.path.abspath(py_file)) != HERE:
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self):
        return "moetune.kernels.cpu", sources_hash(), host_cpu()


class UserProvidedLocator(_PackageStamp, caching.UserProvidedCacheLocator):
    """NUMBA_CACHE_DIR, when set."""


class InTreeLocator(_PackageStamp, caching.InTreeCacheLocator):
    """`__pycache__` beside the source, when writable."""


class UserWideLocator(_PackageStamp, caching.UserWideCacheLocator):
    """The user's cache directory (a read-only install)."""


LOCATORS = (UserProvidedLocator, InTreeLocator, UserWideLocator)


def install() -> None:
    """Put the locators first in numba's list (once; numba asks each in turn when a kernel is decorated)."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    if impl._locator_classes[: len(LOCATORS)] != list(LOCATORS):
        impl._locator_classes[:0] = LOCATORS
