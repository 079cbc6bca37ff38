"""Imports point one way (docs/architecture.md §3): the import-linter contracts in pyproject.toml hold."""

import shutil
import subprocess
from pathlib import Path

import pytest


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports is missing: install the test extra (pip install -e '.[test]')")
    root = Path(__file__).parents[1]
    result = subprocess.run([exe], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout
