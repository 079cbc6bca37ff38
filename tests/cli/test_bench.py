"""`moetune bench` through the real CLI on a tiny checkpoint (correct output shape, not speed)."""

from tests.cli_run import assert_one_line_error, moetune


def test_bench_against_transformers_prints_every_workload_with_a_ratio(checkpoint):
    result = moetune("bench", "--model", str(checkpoint("qwen3_moe")), "--against", "transformers",
                     "--prefill-len", "16", "--decode-steps", "2", "--threads", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for workload, unit in (("prefill b=1 len=16", "GFLOP/s"), ("decode b=1", "GB/s"), ("decode b=16", "GB/s")):
        line = next(line for line in lines if workload in line)
        assert line.count("×") == 1 and unit in line and "%" in line  # ratio, achieved rate, share of the limit
        assert "[" in line  # ... of the limit sampled beside this workload's runs
    assert "threads 1" in result.stdout
    for figure in ("read limit", "matmul limit"):
        line = next(line for line in lines if figure in line)
        assert "/s" in line and "time" in line  # measured value and its formula


def test_bench_against_an_unknown_reference_is_one_line(checkpoint):
    result = moetune("bench", "--model", str(checkpoint("qwen3_moe")), "--against", "vllm")
    assert_one_line_error(result, "vllm", "transformers")
