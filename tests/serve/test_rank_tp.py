"""`moetune serve --tp-size 2 [--ep-size 2]`: requests go to the mesh's data-parallel groups, the
two tensor-parallel ranks of a group step together on the same requests, and the group's TP rank 0
answers for it.

Against what one rank answers alone (the in-process R = 1 server, one request at a time): 16
concurrent greedy requests at TP = 2 and at TP = 2 × EP = 2 (4 real gloo ranks) get exactly its
text, streamed and not; at TP × EP both groups take requests and the expert-distribution recording
writes a run dir with every rank's lock-steps; SIGKILL of the TP peer under load fails the server
as the EP case does (503, error events, one line naming the rank, non-zero exit, no rank left).
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from moetune.engine.ep_launch import first_line, rank_name
from tests.serve.conftest import PROMPTS, ServeProcess, alive, ask, kill_rank_mid_load, metric, recording


def _concurrent(srv, stream: bool) -> list[str]:
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda p: ask(srv, p, stream), PROMPTS))


@pytest.fixture(scope="module")
def tp_ep(tmp_path_factory):
    srv = ServeProcess("--tp-size", "2", "--ep-size", "2", "--max-num-seqs", "4", "--max-queue", "16",
                     cwd=tmp_path_factory.mktemp("serve-tp2-ep2"))  # recordings go to ./runs
    yield srv
    code = srv.stop()
    assert code == 0, srv.stderr
    assert not [pid for pid in srv.ranks if alive(pid)]


def test_16_concurrent_greedy_requests_at_tp2_equal_one_rank_alone(alone):  # noqa: F811
    srv = ServeProcess("--tp-size", "2", "--max-num-seqs", "8", "--max-queue", "16")
    try:
        assert "1 data-parallel group × 2 tensor-parallel" in srv.stderr
        for stream in (False, True):
            assert _concurrent(srv, stream) == alone
        text = srv.metrics()
        assert metric(text, "moetune_rank_assigned_sequences_total", rank=0) == 32  # one DP group took them all
        with pytest.raises(KeyError):
            metric(text, "moetune_rank_assigned_sequences_total", rank=1)  # the TP peer is no group of its own
        assert metric(text, "moetune_rank_kv_blocks_used", rank=0) == 0
        assert srv.stop() == 0, srv.stderr
        assert not [pid for pid in srv.ranks if alive(pid)]
        assert "Traceback" not in srv.stderr
    finally:
        srv.kill()


@pytest.mark.parametrize("stream", [False, True])
def test_16_concurrent_greedy_requests_at_tp2_ep2_equal_one_rank_alone(tp_ep, alone, stream):  # noqa: F811
    assert _concurrent(tp_ep, stream) == alone
    text = tp_ep.metrics()
    assigned = [metric(text, "moetune_rank_assigned_sequences_total", rank=r) for r in (0, 1)]
    assert min(assigned) >= 4  # least work spread them over both DP groups
    assert metric(text, "moetune_rank_dispatch_combine_bytes_total", rank=1) > 0  # the EP all-to-all ran


def test_expert_distribution_recording_at_tp2_ep2_has_every_rank(tp_ep):
    post = recording(tp_ep)
    assert post("start").json() == {"recording": True}
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: ask(tp_ep, p, False), PROMPTS[:4]))
    dumped = post("dump", json={"name": "live-tp2-ep2"})
    assert dumped.status_code == 200, dumped.text
    body = dumped.json()
    assert body["ranks"] == 4 and "decode" in body["kinds"]
    import pandas as pd

    run = Path(body["path"])
    steps = pd.read_parquet(run / "rank_steps.parquet")  # measured on all four ranks, idle lock-steps included
    assert sorted(steps["rank"].unique()) == [0, 1, 2, 3] and len(steps) == 4 * body["steps"]
    mesh = json.loads((run / "summary.json").read_text())["parallel"]["mesh"]
    assert (mesh["world"], mesh["ep_size"], mesh["tp_group"]) == (4, 2, 2)
    assert sorted(pd.read_parquet(run / "rank_tp.parquet")["rank"].unique()) == [0, 1, 2, 3]
    # the run's own tables take each DP group's tokens once: its TP rank 0's (ranks 0 and 2), not all four
    own = steps[steps["rank"].isin([0, 2])]["tokens"].sum()
    merged = pd.read_parquet(run / "steps.parquet")["tokens"].sum()
    assert merged == own and own > 0 and steps["tokens"].sum() == 2 * own


def test_sigkill_of_the_tp_peer_mid_load_fails_the_server_cleanly():
    srv = ServeProcess("--tp-size", "2", "--max-num-seqs", "4")  # rank 1: TP rank 1 of the one DP group
    try:
        kill_rank_mid_load(srv, PROMPTS)
        (line,) = [line.rstrip() for line in srv.lines if "rank 1" in line]
        assert line.startswith("error: rank 1 (EP rank 0, TP rank 1) exited (killed by SIGKILL); "
                               "rank 0 (EP rank 0, TP rank 0) stopped ("), line  # the mesh, not "expert-parallel"
        assert line.endswith(")") and "expert-parallel" not in line, line  # whole
    finally:
        srv.kill()


def test_a_rank_is_named_by_its_place_in_the_mesh_and_a_long_error_is_cut_at_a_word():
    assert rank_name(1) == "expert-parallel rank 1"
    assert rank_name(3, tp_group=2) == "rank 3 (EP rank 1, TP rank 1)"
    assert rank_name(2, tp_group=4) == "rank 2 (EP rank 0, TP rank 2)"
    words = "[/src/gloo/transport/tcp/pair.cc:534] Connection closed by peer " + "averyverylongword " * 40
    line = first_line(RuntimeError(words + "\nsecond line"))
    assert line.startswith("Connection closed by peer averyverylongword") and line.endswith("averyverylongword …")
    assert len(line) <= 302 and "second" not in line
    assert first_line(RuntimeError("[x.cc:1] short one\nmore")) == "short one"
