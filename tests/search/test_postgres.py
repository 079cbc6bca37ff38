"""Two `moetune search` workers on one study in a real PostgreSQL server: N trials between them, none
duplicated, both workers at work."""

import os
import subprocess
import sys

import pytest

from tests.search.postgres import Postgres, server_bin


@pytest.fixture(scope="module")
def postgres_url():
    if server_bin() is None:
        pytest.skip("PostgreSQL server binaries are not installed (Debian: apt-get install postgresql)")
    pytest.importorskip("psycopg2")
    pg = Postgres()
    try:
        url = pg.start()
    except Exception as exc:  # a machine that cannot run a server at all: say so rather than fail obscurely
        pg.stop()
        pytest.skip(f"cannot start a PostgreSQL server here: {exc}")
    yield url
    pg.stop()


def test_two_workers_share_one_postgres_study(run_dir, tmp_path, postgres_url):
    import optuna

    n = 32  # enough trials that the second worker, which starts a moment later, still gets some
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def worker(i: int):
        cmd = [sys.executable, "-m", "moetune", "search", "--trace", str(run_dir), "--hardware", "H200",
               "--storage", postgres_url, "--study", "shared", "--n-trials", str(n), "--seed", str(i),
               "--num-requests", "64", "--out", str(tmp_path / f"w{i}")]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    procs = [worker(0), worker(1)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    trials = optuna.load_study(study_name="shared", storage=postgres_url).get_trials(deepcopy=False)
    # the budget's trials: not surplus, not a twin of a point already priced (its result reused, no budget spent)
    counted = [t for t in trials if not t.user_attrs.get("surplus") and not t.user_attrs.get("twin")]
    assert len(counted) == n
    assert len({t.number for t in trials}) == len(trials)
    assert all(t.state.name in ("COMPLETE", "PRUNED", "FAIL") for t in trials)
    evaluated = [tuple(sorted(t.params.items())) for t in counted
                 if t.state.name == "COMPLETE" and "reused_from" not in t.user_attrs]
    assert len(evaluated) == len(set(evaluated))  # no point evaluated twice
    workers = {t.user_attrs.get("worker") for t in counted if t.user_attrs.get("worker")}
    assert len(workers) == 2
