"""SGLang under the engine evaluator on this machine's CPU: the launch file it runs parses with SGLang's
own argument parser (the flag table dumped from SGLang 0.5.23, flag_table.py) and carries what SGLang's
CPU backend needs (`--device cpu`, $HOST / $PORT). No end-to-end run: SGLang's CPU backend needs its
sgl-kernel built from source (PyPI's sgl-kernel / sglang-kernel wheels hold CUDA kernels only and have
no source distribution), which this repo does not do; see docs/search.md."""

import itertools

import pytest

from moetune.search.cost.deployment import Deployment
from moetune.search.study.engine_eval import engine_launch_text
from moetune.search.study.flag_table import check, commands_of
from moetune.search.study.launch import ServeTarget

CPU = ServeTarget("/models/stdlib-moe", "qwen3_moe", 1, 1, "this-machine", device="cpu")


@pytest.mark.parametrize("max_num_seqs, max_num_batched_tokens", itertools.product([2, 64], [1024, 4096]))
def test_the_cpu_launch_the_evaluator_runs_parses_with_sglangs_parser(max_num_seqs, max_num_batched_tokens):
    d = Deployment(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    text = engine_launch_text("sglang", d, CPU)
    (argv,) = commands_of(text)
    assert check("sglang", argv) is None, argv
    flags = dict(zip(argv, argv[1:]))
    assert flags["--device"] == "cpu" and flags["--model-path"] == "/models/stdlib-moe"
    assert flags["--max-running-requests"] == str(max_num_seqs)
    assert '--host "$HOST"' in text and '--port "$PORT"' in text  # the evaluator's address (placeholders above)


def test_the_parser_would_refuse_a_cpu_launch_with_a_flag_sglang_lacks():
    text = engine_launch_text("sglang", Deployment(), CPU)
    (argv,) = commands_of(text)
    assert "refuses it" in check("sglang", argv + ["--cpu-kvcache-space", "1"])
