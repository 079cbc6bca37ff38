"""The bad-input table (tests/cli/bad_input.py) through the real console script, in subprocesses.

Every case: the exit code, exactly one line on stderr naming what is wrong, no traceback, nothing
on stdout (a streamed completion before an interrupt excepted) and no file left behind in its
directory, which is also its cwd and TMPDIR. The cases run a few at a time in one fixture; each
test only checks its own outcome.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.bad_input import CASES, Case

WORKERS = 3


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    before: set[str]
    after: set[str]
    seconds: float = 0.0


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _args(case: Case, d: Path, src: dict) -> list:
    values = {"d": str(d), **{k: str(v) for k, v in src.items()}}
    return [a.format(**values) if isinstance(a, str) else a for a in case.args]


def _run(case: Case, d: Path, src: dict) -> Outcome:
    start = time.monotonic()
    outcome = _run_case(case, d, src)
    outcome.seconds = time.monotonic() - start
    return outcome


def _run_case(case: Case, d: Path, src: dict) -> Outcome:
    d.mkdir(parents=True)
    (d / "tmp").mkdir()
    if case.prep is not None:
        case.prep(d, src)
    before = _tree(d)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(d / "tmp"), "COLUMNS": "100"}
    cmd = [sys.executable, "-m", "moetune", *_args(case, d, src)]
    if case.signal is None:
        r = subprocess.run(cmd, capture_output=True, cwd=d, env=env, timeout=300)
        return Outcome(r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"),
                       before, _tree(d))
    return _interrupt(case, cmd, d, env, before)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(case: Case, cmd: list, d: Path, env: dict, before: set[str]) -> Outcome:
    # a terminal's Ctrl-C reaches a process whose SIGINT is at its default; a suite started as a background job
    # hands its children SIGINT ignored, so the child restores the default as a shell in a terminal would
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=d, env=env,
                            preexec_fn=_default_sigint)
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(lambda: s.read(1), b"")), daemon=True)
               for s, b in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        started = out if case.wait_for == "stdout" else [n for n in os.listdir(d) if n.startswith(".run.")]
        if started:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # well inside the work, not at its first instruction
    if proc.poll() is None:
        proc.send_signal(getattr(signal, case.signal))
    proc.wait(timeout=120)
    for t in readers:
        t.join(timeout=10)
    return Outcome(proc.returncode, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"),
                   before, _tree(d))


def _run_dir(ck: Path, tmp_path_factory) -> Path:
    """A complete run directory of the tiny checkpoint (its profile compiles the kernels: about a minute on a
    fresh clone, on one core)."""
    from moetune.config import parse_config
    from moetune.profile.runner import ProfileSettings, run_profile
    from moetune.profile.workload import Workload

    work = Workload(num_requests=2, batch_size=2, input_len=8, output_len=2, warmup_steps=0)
    out = tmp_path_factory.mktemp("bad_input_run") / "run"
    run_profile(ProfileSettings(parse_config({"model": {"path": str(ck)}}), work, out=out))
    return out


@pytest.fixture(scope="module")
def outcomes(checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    src = {"ck": checkpoint("qwen3_moe", shard=False), "ck6": checkpoint("olmoe", shard=False),
           "sharded": checkpoint("olmoe", shard=True)}
    # the cases that need neither the run directory nor a model at work go one at a time on the other core
    # while the run directory is made; then the rest, the slow ones (interrupts, model loads) first so they
    # overlap the quick ones
    early = [c for c in CASES if c.early]
    late = sorted((c for c in CASES if not c.early), key=lambda c: c.kind != "interrupt")
    with ThreadPoolExecutor(1) as first, ThreadPoolExecutor(WORKERS) as pool:
        futures = {c.id: first.submit(_run, c, root / c.id, dict(src)) for c in early}
        src["run"] = _run_dir(src["ck"], tmp_path_factory)
        futures.update({c.id: pool.submit(_run, c, root / c.id, src) for c in late})
    results = {c.id: futures[c.id].result() for c in CASES}
    slowest = sorted(results.items(), key=lambda kv: -kv[1].seconds)[:8]
    print("slowest bad-input cases:", ", ".join(f"{cid} {o.seconds:.1f}s" for cid, o in slowest))
    return results


def test_the_table_is_large_and_ids_are_unique():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line(case: Case, outcomes):
    got = outcomes[case.id]
    assert "Traceback" not in got.stderr, got.stderr
    lines = got.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), got.stderr
    for word in case.words:
        assert word in lines[0], (word, lines[0])
    assert got.code == case.code, (got.code, lines[0])
    if not case.stdout_ok:
        assert got.stdout == "", got.stdout
    assert got.after == got.before, f"left behind: {sorted(got.after - got.before)}"


def test_docs_list_every_case():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "bad-input.md").read_text()
    missing = [c.id for c in CASES if f"| {c.id} |" not in doc]
    assert not missing, f"regenerate docs/bad-input.md (python -m tests.cli.write_bad_input_doc): {missing}"
