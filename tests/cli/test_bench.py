"""`moetune bench` through the real CLI on a tiny checkpoint (correct output shape, not speed)."""

from tests.cli_run import assert_one_line_error, moetune


def test_bench_against_transformers_prints_every_workload_with_a_ratio(checkpoint):
    result = moetune("bench", "--model", str(checkpoint("qwen3_moe")), "--against", "transformers",
                     "--prefill-len", "16", "--decode-steps", "2")
    assert result.returncode == 0, result.stderr
    for workload in ("prefill b=1 len=16", "decode b=1", "decode b=16"):
        line = next(line for line in result.stdout.splitlines() if workload in line)
        assert line.count("×") == 1  # both engines measured, ratio shown


def test_bench_against_an_unknown_reference_is_one_line(checkpoint):
    result = moetune("bench", "--model", str(checkpoint("qwen3_moe")), "--against", "vllm")
    assert_one_line_error(result, "vllm", "transformers")
