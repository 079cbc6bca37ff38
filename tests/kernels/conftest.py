"""Kernel tests run Triton through its CPU interpreter; the flag must be set before triton loads."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

pytest.importorskip("triton")
