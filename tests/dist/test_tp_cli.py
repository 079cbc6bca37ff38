"""Tensor parallelism through the real CLI: generate prints what one rank prints; a mesh that does
not match the ranks torchrun started is one line."""

import os
import subprocess
import sys

import pytest

from tests.checkpoints import build_checkpoint
from tests.cli_run import assert_one_line_error, moetune_each


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):  # shared expert and a dense layer: every split kind
    return str(build_checkpoint("qwen2_moe", tmp_path_factory.mktemp("qwen2_moe"), shard=False))


def gen(model, *args) -> tuple:
    return ("generate", "-p", "def f", "--max-tokens", "12", "--ignore-eos", "--model", model, "--device", "cpu",
            *args)


def test_generate_at_tp2_and_tp2_by_ep2_prints_what_one_rank_prints(qwen2):
    one, *meshes = moetune_each(gen(qwen2), gen(qwen2, "--tp-size", "2"),
                                gen(qwen2, "--tp-size", "2", "--ep-size", "2"))
    assert one.returncode == 0, one.stderr
    for got in meshes:
        assert got.returncode == 0, got.stderr
        assert got.stdout == one.stdout


def test_a_mesh_larger_than_torchruns_ranks_is_one_line(qwen2):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}
    got = subprocess.run([sys.executable, "-m", "moetune", "generate", "-p", "x", "--model", qwen2, "--device", "cpu",
                          "--tp-size", "2", "--ep-size", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert_one_line_error(got, "torchrun started 2 processes", "needs 4")
