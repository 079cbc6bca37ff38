"""Serving over ranks when a rank dies, and at R = 4 with replicas.

SIGKILL of rank 1 under load: new requests get 503, the requests in flight end with an error
event, one line names the rank, the command exits non-zero within 10 s and no rank is left.
"""

from concurrent.futures import ThreadPoolExecutor

from tests.serve.conftest import PROMPTS, ServeProcess, alive, ask, kill_rank_mid_load, metric


def test_sigkill_of_rank_1_mid_load_fails_the_server_cleanly():
    srv = ServeProcess("--ep-size", "2", "--max-num-seqs", "4")
    try:
        kill_rank_mid_load(srv, PROMPTS)
    finally:
        srv.kill()


def test_16_concurrent_greedy_requests_at_r4_with_replicas_equal_one_rank_alone(alone):
    srv = ServeProcess("--ep-size", "4", "--redundant-experts", "4", "--placement", "round_robin",
                     "--max-num-seqs", "4", "--max-queue", "0")
    try:
        for stream in (False, True):
            with ThreadPoolExecutor(16) as pool:
                got = list(pool.map(lambda p: ask(srv, p, stream), PROMPTS))
            assert got == alone
        text = srv.metrics()
        assert all(metric(text, "moetune_rank_assigned_sequences_total", rank=r) >= 4 for r in range(4))
        assert srv.stop() == 0, srv.stderr
        assert not [pid for pid in srv.ranks if alive(pid)]
    finally:
        srv.kill()
