"""A command that writes a run directory leaves nothing behind when a later step fails (issue 23):
`profile --report` whose report cannot be written (a file-size limit standing in for a full disk)."""

import os
import resource
import subprocess
import sys

LIMIT = 20 * 1024  # bytes per file: the run directory's files fit (checked), the report's plots do not


def _profile(out, *extra, mpl):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    return subprocess.run([sys.executable, "-m", "moetune", "profile", "--device", "cpu", "--num-requests", "2",
                           "--batch-size", "2", "--input-len", "8", "--output-len", "2", "--warmup-steps", "0",
                           "--out", str(out), *extra], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MOETUNE_PROGRESS": "off",  # the error line alone
                               "MPLCONFIGDIR": str(mpl)},
                          preexec_fn=limit)


def _font_cache(tmp_path_factory):
    """matplotlib builds its font cache on first use; on a fresh machine that write hits the limit too
    (two more lines on stderr, about the cache, not the run): it is built first, without the limit."""
    mpl = tmp_path_factory.mktemp("mpl")
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True, timeout=120,
                   env={**os.environ, "MPLCONFIGDIR": str(mpl)})
    return mpl


def test_profile_report_that_cannot_be_written_leaves_no_run_directory(tmp_path, tmp_path_factory):
    mpl = _font_cache(tmp_path_factory)
    fits = _profile(tmp_path / "plain", mpl=mpl)
    assert fits.returncode == 0 and (tmp_path / "plain" / "summary.json").is_file(), fits.stderr
    failed = _profile(tmp_path / "run", "--report", mpl=mpl)
    assert failed.returncode == 1, failed.stderr
    lines = [line for line in failed.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: File too large"), failed.stderr
    assert not (tmp_path / "run").exists() and failed.stdout.strip() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]
