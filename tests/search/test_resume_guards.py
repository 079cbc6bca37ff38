"""`moetune search` never replaces a damaged study.db and never mixes a study's inputs (issue 23)."""

import shutil

from tests.cli_run import assert_one_line_error, moetune


def _search(run_dir, out, *extra):
    return moetune("search", "--trace", str(run_dir), "--out", str(out), "--hardware", "H200", "--n-trials", "3",
                   *extra)


def test_an_empty_or_foreign_study_db_is_refused_and_left_as_it_was(run_dir, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    db = out / "study.db"
    db.write_bytes(b"")
    assert_one_line_error(_search(run_dir, out), "study.db is empty (0 bytes)", "not replaced")
    assert db.read_bytes() == b"" and sorted(p.name for p in out.iterdir()) == ["study.db"]
    db.write_text("trial,value\n1,2\n")
    assert_one_line_error(_search(run_dir, out), "not an SQLite database")
    assert db.read_text() == "trial,value\n1,2\n"


def test_resuming_under_another_trace_or_space_is_refused_unless_asked(run_dir, tmp_path):
    out = tmp_path / "o"
    assert _search(run_dir, out).returncode == 0
    before = (out / "trials.csv").read_text()
    other = tmp_path / "other-run"
    shutil.copytree(run_dir, other)
    assert_one_line_error(_search(other, out, "--n-trials", "5"), "was started with other inputs", "trace=",
                          "--allow-changed-inputs")
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: [1, 2]\n")
    assert_one_line_error(_search(run_dir, out, "--n-trials", "5", "--space", str(space)), "space=")
    assert (out / "trials.csv").read_text() == before  # nothing of the refused runs was written
    again = _search(run_dir, out, "--n-trials", "5")  # the same inputs continue
    assert again.returncode == 0, again.stderr
    asked = _search(other, out, "--n-trials", "6", "--allow-changed-inputs")
    assert asked.returncode == 0, asked.stderr
