"""Long commands say how far they are when piped: one plain line every few seconds on stderr (phase,
done/total, rate, elapsed, ETA), through the real console script; and the line format itself."""

import io
import re
import time

import pytest

from moetune.cli.progress import PlainProgress
from tests.cli_run import moetune

LINE = re.compile(r"^(profile|eval|search|bench|simulate|quantize): [a-z -]+( \d+/\d+ \(\d+%\))?(, [\d.]+/s)?, elapsed [\d.]+ (s|min|h)"
                  r"(, ETA [\d.]+ (s|min|h))?(, .*)?$")


@pytest.fixture
def fast_progress(monkeypatch):
    monkeypatch.setenv("MOETUNE_PROGRESS_S", "0.2")
    monkeypatch.delenv("MOETUNE_PROGRESS", raising=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A small profile run through the CLI, replayed (read-only) by the search and simulate tests."""
    out = tmp_path_factory.mktemp("progress") / "run"
    r = moetune("profile", "--num-requests", "4", "--batch-size", "4", "--input-len", "8", "--output-len", "4",
                "--warmup-steps", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def progress_lines(stderr: str, command: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.startswith(f"{command}: ")]
    for line in lines:
        assert LINE.match(line), line
    return lines


def test_a_plain_line_has_phase_done_total_rate_and_eta():
    out = io.StringIO()
    bar = PlainProgress("profile", every=0.05, stream=out)
    bar.phase("loading model")
    time.sleep(0.15)
    assert out.getvalue() == ""  # nothing before the work advances: a load error stays the one stderr line
    bar.phase("steps", total=40)
    bar.update(advance=10)
    time.sleep(0.2)
    bar.phase("writing")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines
    assert any(re.search(r"steps 10/40 \(25%\), [\d.]+/s, elapsed .*, ETA ", line) for line in lines)


def test_profile_piped_prints_its_steps(fast_progress, tmp_path):
    r = moetune("profile", "--num-requests", "4", "--batch-size", "2", "--input-len", "8", "--output-len", "8",
                "--warmup-steps", "0", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    lines = progress_lines(r.stderr, "profile")
    assert any(re.match(r"profile: steps 16/16 \(100%\), [\d.]+/s", line) for line in lines), r.stderr
    assert "Phase breakdown" in r.stdout and "profile:" not in r.stdout


def test_eval_piped_prints_its_phases(fast_progress, tmp_path):
    r = moetune("eval", "--max-windows", "4", "--window", "64", "--num-prompts", "9", "--greedy-tokens", "2")
    assert r.returncode == 0, r.stderr
    lines = progress_lines(r.stderr, "eval")
    assert any(line.startswith("eval: perplexity windows 1/1 (100%)") for line in lines), r.stderr
    assert any(line.startswith("eval: agreement 4/4 (100%)") for line in lines), r.stderr
    assert r.stdout.startswith("perplexity ")


def test_search_piped_prints_its_trials(fast_progress, run, tmp_path):
    r = moetune("search", "--trace", str(run), "--hardware", "H100", "--n-trials", "12", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    lines = progress_lines(r.stderr, "search")
    assert any(re.match(r"search: trials 12/12 \(100%\), [\d.]+/s, elapsed .*, (best|no feasible)", line)
               for line in lines), r.stderr


def test_bench_piped_prints_its_workloads(fast_progress):
    r = moetune("bench", "--prefill-len", "16", "--decode-steps", "2", "--runs", "3")
    assert r.returncode == 0, r.stderr
    lines = progress_lines(r.stderr, "bench")
    assert any(re.match(r"bench: workloads (\d+)/\1 \(100%\), [\d.]+/s", line) for line in lines), r.stderr
    assert "bench:" not in r.stdout


def test_simulate_piped_prints_its_lock_steps(fast_progress, run):
    r = moetune("simulate", "--trace", str(run), "--hardware", "H100")
    assert r.returncode == 0, r.stderr
    lines = progress_lines(r.stderr, "simulate")
    assert any(re.match(r"simulate: pricing lock-steps (\d+)/\1 \(100%\)", line) for line in lines), r.stderr


def test_quantize_piped_prints_its_layers(fast_progress, tmp_path):
    r = moetune("quantize", "--policy", "int8", "--out", str(tmp_path / "q"))
    assert r.returncode == 0, r.stderr
    lines = progress_lines(r.stderr, "quantize")
    assert any(re.match(r"quantize: packing layers (\d+)/\1 \(100%\)", line) for line in lines), r.stderr
    assert r.stdout.startswith("experts: ")
