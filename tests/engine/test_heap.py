"""Freed activation memory stays in the process (engine/heap.py): a block freed and taken again is
not faulted in again, spawned processes start with the same settings, a user's own settings win.
Each case runs in a fresh interpreter: malloc settings are per process and cannot be undone."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# 20 MiB taken, written and freed three times: the page faults of each round, as JSON
_ROUNDS = """
import ctypes, json, resource, sys
{setup}
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds = []
for _ in range(3):
    f0, p = faults(), libc.malloc(20 << 20)
    libc.memset(p, 1, 20 << 20)
    rounds.append(faults() - f0)
    libc.free(p)
print(json.dumps({{"got": got, "faults": rounds}}))
"""
_KEEP = "from moetune.engine.heap import keep_freed_memory\ngot = keep_freed_memory()"


def _run(setup: str, **env) -> dict:
    return _python(_ROUNDS.format(setup=setup), **env)


def _python(code: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                         check=True, timeout=60)
    return json.loads(out.stdout)


def test_a_freed_block_is_reused_without_page_faults():
    kept = _run(_KEEP)
    assert kept["got"] == "kept"
    assert kept["faults"][0] > 2000  # 5,120 pages the first time
    assert max(kept["faults"][1:]) < 100  # then the same memory again
    default = _run("got = None")  # glibc unchanged: the freed block went back to the kernel
    assert default["faults"][1] > 2000


def test_spawned_processes_start_with_the_settings():
    code = ("import subprocess, sys\n" + _KEEP + "\nprint(subprocess.run([sys.executable, '-c', "
            + repr(_ROUNDS.format(setup="got = None")) + "], capture_output=True, text=True).stdout)")
    child = _python(code)
    assert max(child["faults"][1:]) < 100


def test_the_users_own_malloc_settings_win():
    mine = _run(_KEEP, MALLOC_TRIM_THRESHOLD_="131072")
    assert mine["got"] == "environment"
    assert mine["faults"][1] > 2000  # (a 128 KiB trim threshold hands the block back)
    tunable = _run(_KEEP, GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert tunable["got"] == "environment"


def test_heap_policy_names_the_settings(monkeypatch):
    from moetune.engine import heap

    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"):
        monkeypatch.delenv(k, raising=False)
    assert heap.heap_policy() == "default"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(heap.MMAP_THRESHOLD))
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(heap.TRIM_THRESHOLD))
    assert heap.heap_policy() == "kept"
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert heap.heap_policy() == f"MALLOC_MMAP_THRESHOLD_={heap.MMAP_THRESHOLD}, MALLOC_TRIM_THRESHOLD_=131072"
