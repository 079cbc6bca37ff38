"""Threads are set once per process: torch's pool and the CPU kernels', in every thread."""

import subprocess
import sys

CODE = """
import threading, torch
from moetune.engine.threads import available_cores, use_threads
n = use_threads({threads})
from moetune.kernels.cpu import linear
linear(torch.randn(2, 64), torch.randn(8, 64))  # numba loads now, after the count was set
import numba
seen = []
t = threading.Thread(target=lambda: seen.append((torch.get_num_threads(), numba.get_num_threads())))
t.start(); t.join()
print(n, available_cores(), torch.get_num_threads(), numba.get_num_threads(), *seen[0], numba.threading_layer())
"""


def _run(threads) -> list[str]:
    out = subprocess.run([sys.executable, "-c", CODE.format(threads=threads)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_one_thread_everywhere_including_other_threads():
    n, _, torch_main, kernels_main, torch_other, kernels_other, layer = _run(1)
    assert (n, torch_main, kernels_main, torch_other, kernels_other) == ("1",) * 5
    assert layer == "omp"  # the OpenMP layer: see moetune/kernels/cpu/runtime.py


def test_default_is_the_cores_the_process_may_use():
    n, cores, torch_main, kernels_main, *_ = _run(None)
    assert n == cores == torch_main == kernels_main
