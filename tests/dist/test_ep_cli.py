"""Expert parallelism through the real CLI: bad input (one line each) and dead ranks (no hang)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.moe.placement import make_placement, write_placement
from tests.checkpoints import build_checkpoint
from tests.cli_run import assert_one_line_error, moetune, moetune_each


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):  # 5 experts, 3 MoE layers
    return str(build_checkpoint("mixtral", tmp_path_factory.mktemp("mixtral"), shard=False))


def gen(model, *args):
    return moetune("generate", "-p", "def f", "--max-tokens", "3", "--model", model, "--device", "cpu", *args)


def test_ep_size_must_divide_experts_plus_redundant(mixtral):
    assert_one_line_error(gen(mixtral, "--ep-size", "2"), "--ep-size 2 does not divide the model's 5 experts")
    assert_one_line_error(gen(mixtral, "--ep-size", "4", "--redundant-experts", "2"), "5 experts + 2 redundant")


def test_ep_size_over_the_slots(mixtral):
    assert_one_line_error(gen(mixtral, "--ep-size", "8", "--redundant-experts", "1"), "larger than the 6 physical")


def test_placement_file_for_another_model_or_ep_size(mixtral, tmp_path):
    other = tmp_path / "qwen.json"
    write_placement(make_placement("contiguous", 6, 2, [1], model_type="qwen2_moe"), other)
    assert_one_line_error(gen(mixtral, "--ep-size", "2", "--placement", str(other)), "qwen2_moe")
    mine = tmp_path / "mixtral.json"
    write_placement(make_placement("contiguous", 5, 2, [0, 1, 2], 1, model_type="mixtral"), mine)
    assert_one_line_error(gen(mixtral, "--ep-size", "3", "--placement", str(mine)), "--ep-size 2, not 3")
    assert_one_line_error(gen(mixtral, "--ep-size", "2", "--placement", str(tmp_path / "nope.json")), "does not exist")


def test_generate_with_two_ranks_prints_what_one_rank_prints(mixtral):
    args = ("generate", "-p", "def f", "--max-tokens", "3", "--model", mixtral, "--device", "cpu")
    one, two = moetune_each(args, (*args, "--ep-size", "2", "--redundant-experts", "1"))
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert one.stdout == two.stdout


def _spawned_ranks(parent: int, want: int, within_s: float = 60) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
        ranks = [int(p) for p in found if "spawn_main" in _proc_file(int(p), "cmdline")]
        if len(ranks) == want:
            return ranks
        time.sleep(0.2)
    raise AssertionError("the ranks did not start")


def _long_run(model):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "moetune", "generate", "-p", "def f", "--max-tokens", "200",
                             "--ignore-eos", "--model", model, "--device", "cpu", "--ep-size", "2",
                             "--redundant-experts", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def test_a_killed_rank_is_named_and_nobody_hangs(mixtral):
    proc = _long_run(mixtral)
    (child,) = _spawned_ranks(proc.pid, 1)
    proc.stdout.read(1)  # the first streamed piece: both ranks are inside the step loop
    os.kill(child, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "rank 1" in lines[0] and "SIGKILL" in lines[0], err


def test_killing_rank_zero_stops_the_others_with_one_line_each(mixtral):
    proc = _long_run(mixtral)
    (child,) = _spawned_ranks(proc.pid, 1)
    proc.stdout.read(1)  # inside the step loop
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)  # until rank 1, which shares the pipe, has exited too
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "rank 1" in lines[0] and "rank 0" in lines[0], err  # no C++ store stack
    deadline = time.monotonic() + 60
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(child), "rank 1 still runs after rank 0 died"


def _proc_file(pid: int, name: str) -> str:
    """/proc/<pid>/<name>, or "" once the process is gone: it can go between the listing (or an exists()
    check) and the read, e.g. rank 1 reaped by init just after it exits."""
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="ignore")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Alive: neither gone nor a zombie (one that exited but whose dead parent has not been reaped)."""
    stat = _proc_file(pid, "stat")
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"
