"""numba's disk cache of the CPU kernels cannot go stale (`kernels/cpu/_cache.py`): every kernel is
stamped with a hash of all of the package's kernel sources, so a kernel whose callee lives in another
file recompiles when only that other file changed (numba alone stamps a kernel with its own file, and
would hand back the old callee's machine code). Checked on a copy of the package, in processes of
their own: a caller in one file, its callee in another, the callee edited between runs. And the
kernels compile once per logical call (docs/cpu.md, "Compiling the kernels"): no kernel holds a
signature with a literal int or a uint64 (a prange index) where its other callers pass an int64."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("numba")

import moetune  # noqa: E402
from moetune.engine.generate import Generator  # noqa: E402
from moetune.engine.sampling import SamplingParams  # noqa: E402
from moetune.model.loader import load_model  # noqa: E402
from moetune.quant.table import PrecisionTable  # noqa: E402
from tests.checkpoints import build_checkpoint  # noqa: E402

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



# kernels whose literal argument is a compile-time size (a tuple's length goes with it)
LITERAL_BY_DESIGN = {"moetune.kernels.cpu._jit_q8._put"}


def _kernel_signatures() -> dict[str, list[str]]:
    """Every numba kernel of moetune loaded in this process → its compiled signatures."""
    from numba.core.dispatcher import Dispatcher

    out = {}
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith("moetune.kernels.cpu."):
            for value in list(vars(module).values()):
                if isinstance(value, Dispatcher):
                    out[f"{value.py_func.__module__}.{value.py_func.__name__}"] = [str(s) for s in value.signatures]
    return out


def test_a_kernel_takes_int64_indices_from_every_caller(tmp_path):
    """Fused and unfused decode steps of a tiny qwen3_moe with fp32, int8 and int4-g32 projections and
    experts: no kernel signature takes a literal int or a uint64 (each would compile the kernel once
    more on a cold start: `_jit_tiles.I0`)."""
    ck = build_checkpoint("qwen3_moe", tmp_path, hidden_size=64, moe_intermediate_size=64)
    for fmt in (None, "int8", "int4-g32"):
        spec = load_model(ck).spec
        table = None if fmt is None else PrecisionTable({i: (fmt,) * spec.moe.num_experts for i in spec.moe_layers})
        model = load_model(ck, precision=table, dense=fmt)
        for fused in (model.fused, None):
            model.fused = fused
            list(Generator(model, tokenizer=None, eos_ids=frozenset()).generate(
                [[5, 9, 11], [7, 3, 3, 8, 21, 6, 2], [30]], SamplingParams(max_tokens=3, ignore_eos=True)))
    bad = {k: [s for s in sigs if "Literal[int]" in s or "uint64" in s]
           for k, sigs in _kernel_signatures().items() if k not in LITERAL_BY_DESIGN}
    assert not {k: v for k, v in bad.items() if v}
    assert len(_kernel_signatures()) > 20


def test_no_kernel_reads_a_dynamic_global(monkeypatch):
    """A kernel that reads a dynamic global (numba's `get_num_threads`, a ctypes pointer, a large global
    array) cannot go into the disk cache: it compiles again in every process, numba only warns ("Cannot
    cache compiled function"), and so does every kernel that calls it (`moe_block` through `experts_q4r`).
    Checked over every kernel compiled or loaded in this process after int4 experts at one row an expert
    on two threads (the path that once asked numba for its thread count) and the other tests' decodes."""
    from numba.core.dispatcher import Dispatcher

    from moetune.kernels.cpu import fused_experts_cpu, quantize_int4, runtime

    monkeypatch.setattr(runtime, "SERIAL_BYTES", 0)
    g = torch.Generator().manual_seed(3)
    w13 = quantize_int4(torch.randn(2, 64, 64, generator=g), 32)  # [E, 2I, D]
    w2 = quantize_int4(torch.randn(2, 64, 32, generator=g), 32)  # [E, D, I]
    fused_experts_cpu(torch.randn(2, 64, generator=g), torch.tensor([0, 1, 2]), w13, w2, threads=2)
    dynamic = sorted(f"{d.py_func.__module__}.{d.py_func.__name__}"
                     for module in list(sys.modules.values()) if getattr(module, "__name__", "").startswith("moetune.")
                     for d in list(vars(module).values()) if isinstance(d, Dispatcher)
                     for cres in list(d.overloads.values()) if cres.library.has_dynamic_globals)
    assert not dynamic
    assert "moetune.kernels.cpu._jit_q4r.experts_q4r" in _kernel_signatures()
