"""numba's disk cache of the CPU kernels cannot go stale (`kernels/cpu/_cache.py`): every kernel is
stamped with a hash of all of the package's kernel sources, so a kernel whose callee lives in another
file recompiles when only that other file changed (numba alone stamps a kernel with its own file, and
would hand back the old callee's machine code). Checked on a copy of the package, in processes of
their own: a caller in one file, its callee in another, the callee edited between runs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

import moetune  # noqa: E402

CALLEE = """from numba import njit
from moetune.kernels.cpu._opts import OPTS


@njit(**OPTS)
def value(x):
    return x + {add}
"""
CALLER = """from numba import njit
from moetune.kernels.cpu._opts import OPTS
from moetune.kernels.cpu._probe_callee import value


@njit(**OPTS)
def twice(x):
    return 2 * value(x)
"""
RUN = """import moetune
from moetune.kernels.cpu._probe_caller import twice
print(moetune.__file__, twice(1), sum(twice.stats.cache_hits.values()))
"""


def _run(root: Path) -> tuple[str, int, int]:
    """One process on the copy: (the moetune it imported, twice(1), the caller's cache hits)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("NUMBA_CACHE_DIR", None)  # the copy's own __pycache__
    got = subprocess.run([sys.executable, "-c", RUN], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    where, value, hits = got.stdout.split()
    return where, int(value), int(hits)


def test_a_caller_recompiles_when_only_its_callees_file_changed(tmp_path):
    package = Path(moetune.__file__).parent
    shutil.copytree(package, tmp_path / "moetune", ignore=shutil.ignore_patterns("assets", "__pycache__", "*.nb[ic]"))
    cpu = tmp_path / "moetune" / "kernels" / "cpu"
    (cpu / "_probe_caller.py").write_text(CALLER)
    (cpu / "_probe_callee.py").write_text(CALLEE.format(add=1))
    where, value, hits = _run(tmp_path)
    assert Path(where).parent == tmp_path / "moetune" and (value, hits) == (4, 0)  # compiled
    assert _run(tmp_path)[1:] == (4, 1)  # the same sources: loaded from the disk cache
    (cpu / "_probe_callee.py").write_text(CALLEE.format(add=5))
    assert _run(tmp_path)[1:] == (12, 0)  # the callee's file changed: the caller recompiled, not 4 from the cache

