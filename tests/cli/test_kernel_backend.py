"""--kernel-backend through the real CLI: triton on a CPU runs under the interpreter, same text as torch."""

import os
import subprocess
import sys


def _generate(path: str, backend: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the CLI must switch it on itself
    args = ["generate", "--model", path, "--prompt", "def add(a, b):", "--max-tokens", "4", "--ignore-eos",
            "--kernel-backend", backend]
    return subprocess.run([sys.executable, "-m", "moetune", *args], capture_output=True, text=True, timeout=300,
                          env={**env, "OMP_NUM_THREADS": "1"})


def test_triton_backend_on_cpu_runs_interpreted_and_matches_torch(checkpoint):
    path = str(checkpoint("qwen3_moe"))
    torch_out, triton_out = _generate(path, "torch"), _generate(path, "triton")
    assert torch_out.returncode == 0 and triton_out.returncode == 0, triton_out.stderr
    assert triton_out.stdout == torch_out.stdout
    assert "interpreter" in triton_out.stderr and "interpreter" not in torch_out.stderr


def test_cpu_backend_is_the_cpu_default_and_matches_torch(checkpoint):
    path = str(checkpoint("qwen3_moe"))
    cpu, torch_out = _generate(path, "cpu"), _generate(path, "torch")
    assert cpu.returncode == 0 and torch_out.returncode == 0, cpu.stderr
    assert cpu.stdout == torch_out.stdout


def test_threads_must_be_positive(checkpoint):
    from tests.cli_run import moetune

    result = moetune("generate", "--model", str(checkpoint("qwen3_moe")), "--prompt", "x", "--threads", "0")
    assert result.returncode == 2 and "--threads" in result.stderr
