"""A user mistake answers before torch or pandas loads: a sample of the bad-input table
(tests/cli/bad_input.py), one per place that used to load them first (the target, the placement,
profile's run tables, torchrun's environment, quantize and tune-kernels threads, a multi-rank
server's checks, the context checked from the checkpoint before the device), run through the real
console script under `python -X importtime`, whose report on stderr names every module the
process imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.cli.bad_input import CASES

IDS = ("model-dir-missing", "config-unsupported-type", "router-gate-fewer-rows", "ep-size-not-divisor",
       "tp-size-not-divisor", "capacity-factor-nan", "prompts-jsonl-not-json", "recipe-ranks-do-not-tile",
       "quantize-unknown-format", "quantize-hot-without-loads", "tune-kernels-out-below-file",
       "serve-ep-expert-share", "generate-max-tokens-over-context", "profile-input-over-context")
HEAVY = ("torch", "pandas", "transformers", "numba")
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| *([\w.]+)$")


def imported_and_said(stderr: str) -> tuple[set[str], list[str]]:
    """(top-level packages imported, the other lines) of a `python -X importtime` stderr."""
    packages, said = set(), []
    for line in stderr.splitlines():
        m = IMPORTED.match(line)
        if m:
            packages.add(m.group(1).split(".")[0])
        elif not line.startswith("import time:"):
            said.append(line)
    return packages, said


def test_the_importtime_report_is_read():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json.decoder"], capture_output=True,
                         text=True, check=True)
    packages, said = imported_and_said(out.stderr)
    assert "json" in packages and said == []


@pytest.mark.parametrize("case", [c for c in CASES if c.id in IDS], ids=lambda c: c.id)
def test_a_mistake_answers_before_torch_loads(case, checkpoint, tmp_path):
    src = {"ck": checkpoint("qwen3_moe", shard=False), "ck6": checkpoint("olmoe", shard=False)}
    (tmp_path / "tmp").mkdir()
    if case.prep is not None:
        case.prep(tmp_path, src)
    values = {"d": str(tmp_path), **{k: str(v) for k, v in src.items()}}
    args = [a.format(**values) if isinstance(a, str) else a for a in case.args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "moetune", *args], capture_output=True,
                         cwd=tmp_path, env=env, timeout=120)
    packages, said = imported_and_said(out.stderr.decode(errors="replace"))
    assert out.returncode == case.code and len(said) == 1 and said[0].startswith("error: "), said
    assert all(word in said[0] for word in case.words), said[0]
    assert not packages & set(HEAVY), f"{sorted(packages & set(HEAVY))} loaded before: {said[0]}"


def test_the_sample_is_in_the_table():
    assert {c.id for c in CASES} >= set(IDS)
