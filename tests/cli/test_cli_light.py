import subprocess
import sys


def test_the_cli_imports_no_torch_or_transformers():
    code = ("import sys, moetune.cli.main; heavy = [m for m in ('torch', 'transformers', 'triton', 'pandas', 'numba') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "moetune", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("generate", "bench", "models", "serve", "bench-serve"):
        assert command in out.stdout
