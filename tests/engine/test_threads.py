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


def test_wait_policy_spins_on_a_quiet_machine_and_sleeps_on_a_busy_one(monkeypatch):
    from moetune.engine import threads

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    cores = threads.available_cores()
    monkeypatch.setattr(threads, "runnable_others", lambda: cores)
    assert threads.choose_wait_policy() == "sleep"
    assert threads.wait_policy() == "sleep (OMP_WAIT_POLICY=PASSIVE)"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setattr(threads, "runnable_others", lambda: cores - 1)
    assert threads.choose_wait_policy() == "spin"
    assert threads.wait_policy() == f"spin (GOMP_SPINCOUNT={threads.SPIN_COUNT})"
    assert "OMP_WAIT_POLICY" not in threads.os.environ


def test_busy_is_what_runs_now_and_the_load_average_only_where_that_is_unknown(monkeypatch, tmp_path):
    from moetune.engine import threads

    loadavg = tmp_path / "loadavg"
    loadavg.write_text("1.93 1.10 0.71 3/412 31337\n")  # a benchmark just ended; two tasks run besides us
    assert threads.runnable_others(str(loadavg), gap_s=0) == 2
    assert threads.runnable_others(str(tmp_path / "missing")) is None
    loadavg.write_text("garbage\n")
    assert threads.runnable_others(str(loadavg), gap_s=0) is None
    cores = threads.available_cores()
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (cores + 0.5, 0.0, 0.0))  # lags: ignored when the count is known
    monkeypatch.setattr(threads, "runnable_others", lambda: 0)
    assert not threads.machine_busy()
    monkeypatch.setattr(threads, "runnable_others", lambda: None)
    assert threads.machine_busy()


def test_an_explicit_wait_setting_in_the_environment_wins(monkeypatch):
    from moetune.engine import threads

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1e6, 0.0, 0.0))
    assert threads.choose_wait_policy() == "environment"
    assert threads.os.environ["OMP_WAIT_POLICY"] == "active" and "GOMP_SPINCOUNT" not in threads.os.environ
    assert threads.wait_policy() == "spin (OMP_WAIT_POLICY=ACTIVE)"


def test_the_console_script_chooses_before_torch_loads():
    code = ("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); os.environ.pop('GOMP_SPINCOUNT', None); "
            "sys.argv = ['moetune', '--help']; from moetune.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    torch_loaded, policy, spin = out.stdout.split()[-3:]
    assert torch_loaded == "False"  # --help stays instant, and the policy is set before torch's OpenMP loads
    assert (policy, spin) in (("PASSIVE", "None"), ("None", "100000"))


def test_a_server_sleeps_only_where_the_machine_stays_busy_over_its_start(monkeypatch):
    from moetune.engine import threads

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    cores = threads.available_cores()
    reads = iter([10 * cores] * 19 + [0] * 6)  # a load that passes: busy in 19 of 25 reads
    monkeypatch.setattr(threads, "runnable_others", lambda **kw: next(reads))
    assert threads.choose_wait_policy(server=True) == "spin"
    assert "OMP_WAIT_POLICY" not in threads.os.environ
    assert threads.wait_policy() == (f"spin (GOMP_SPINCOUNT={threads.SPIN_COUNT}; a server's: 19 of 25 reads "
                                     "over 1 s at start saw a busy machine)")
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setattr(threads, "runnable_others", lambda **kw: cores - 1)  # a client alone, on 2 cores
    assert threads.choose_wait_policy(server=True) == "spin"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    reads = iter([cores] * 20 + [0] * 5)  # it stays busy
    monkeypatch.setattr(threads, "runnable_others", lambda **kw: next(reads))
    assert threads.choose_wait_policy(server=True) == "sleep"
    assert threads.wait_policy().startswith("sleep (OMP_WAIT_POLICY=PASSIVE; a server's: 20 of 25 reads")
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the user's word wins, without reading anything
    monkeypatch.setattr(threads, "runnable_others", lambda **kw: 1 / 0)
    assert threads.choose_wait_policy(server=True) == "environment"
    assert threads.wait_policy() == "sleep (OMP_WAIT_POLICY=PASSIVE)"
