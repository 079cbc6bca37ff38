"""Run the real `moetune` CLI in a subprocess and check the one-line error contract."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def moetune(*args, cwd=None, env=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "moetune", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env=env)


def moetune_each(*calls: tuple, cwd=None, env=None) -> list:
    """Independent `moetune(*args)` calls, two processes at a time (a one-thread command uses one of the
    machine's cores; the suite is otherwise one process): their results, in the order given."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda args: moetune(*args, cwd=cwd, env=env), calls))


def assert_one_line_error(result, *fragments):
    """Non-zero exit, exactly one line on stderr naming every fragment, no traceback, nothing on stdout."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout.strip() == ""
