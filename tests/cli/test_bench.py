"""`moetune bench` through the real CLI on a tiny checkpoint (correct output shape, not speed)."""

import pytest

from tests.cli_run import assert_one_line_error, moetune


@pytest.fixture
def plain(tiny_bench):
    """The fp32 model benched against transformers (tests/conftest.py: one launch, shared, read-only)."""
    assert tiny_bench.returncode == 0, tiny_bench.stderr
    return tiny_bench


def test_bench_against_transformers_prints_every_workload_with_a_ratio(plain):
    lines = plain.stdout.splitlines()
    for workload, unit in (("prefill b=1 len=16", "GFLOP/s"), ("decode b=1", "GB/s"), ("decode b=16", "GB/s")):
        line = next(line for line in lines if workload in line)
        assert line.count("×") == 1 and unit in line and "%" in line  # ratio, achieved rate, share of the limit
        assert "[" in line  # ... of the limit sampled beside this workload's runs
    assert "threads 1" in plain.stdout
    for figure in ("read limit", "matmul limit"):
        line = next(line for line in lines if figure in line)
        assert "/s" in line and "time" in line  # measured value and its formula


def test_bench_against_an_unknown_reference_is_one_line(checkpoint):
    result = moetune("bench", "--model", str(checkpoint("qwen3_moe")), "--against", "vllm")
    assert_one_line_error(result, "vllm", "transformers")


def _mb_per_token(stdout: str, workload: str) -> float:
    line = next(line for line in stdout.splitlines() if workload in line)
    return float(line.split()[-1])  # the last column (piped: one line a row, columns apart by spaces)


def test_bench_shows_each_parts_precision_and_bytes_per_token(plain, tiny_bench_int8):
    """A recipe with int8 experts and int8 dense projections: the precision line names every part,
    and each decode step reads fewer bytes per token than the fp32 model's (and b=16 fewer than b=1).
    The fp32 figures are the `plain` launch's (with --against its moetune columns are the same); both
    launches are tests/conftest.py's `tiny_benches`, run side by side."""
    quant = tiny_bench_int8
    assert quant.returncode == 0, quant.stderr
    assert "precision: experts int8 · attention int8 · lm_head int8 · router fp32 · embedding fp32" in quant.stdout
    assert "precision: experts fp32 · attention fp32 · lm_head fp32" in plain.stdout
    for workload in ("decode b=1", "decode b=16"):
        assert 0 < _mb_per_token(quant.stdout, workload) < _mb_per_token(plain.stdout, workload) / 2.5
    assert _mb_per_token(quant.stdout, "decode b=16") < _mb_per_token(quant.stdout, "decode b=1")
