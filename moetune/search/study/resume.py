"""Guards before a study is continued: the storage file is a real SQLite database, and a resumed
study runs on the inputs it started with.

A `study.db` truncated to 0 bytes (or any file that is not SQLite) used to be opened as a new,
empty database: the search ran from scratch with rc 0 and overwrote the earlier trials' winner
and tables. And a study continued under another `--trace` or `--space` mixed trials measured on
different inputs into one ranking. Both are refused with one line; the second can be asked for
(`--allow-changed-inputs`).
"""

from __future__ import annotations

import json
from pathlib import Path

from moetune.errors import MoetuneError

SQLITE_MAGIC = b"SQLite format 3\x00"
INPUTS_ATTR = "moetune_inputs"  # the study's user attribute holding the inputs it started with


def check_storage_file(storage: str) -> None:
    """For sqlite:///PATH: an existing PATH must be an SQLite database (a missing one is created)."""
    if not storage.startswith("sqlite:///"):
        return
    path = Path(storage.removeprefix("sqlite:///"))
    if not path.exists() or str(path) == ":memory:":
        return
    if path.is_dir():
        raise MoetuneError(f"the study storage {path} is a directory, not an SQLite database")
    with path.open("rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        what = "empty (0 bytes)" if not head else "not an SQLite database"
        raise MoetuneError(f"the study storage {path} is {what}; it is not replaced: move it away to start a new "
                           "study, or restore it to continue")


def check_same_inputs(study, inputs: dict, allow_changed: bool) -> None:
    """Record `inputs` on a study's first run; on a resume, refuse other inputs unless allowed."""
    seen = study.user_attrs.get(INPUTS_ATTR)
    if seen is None or not study.trials:
        study.set_user_attr(INPUTS_ATTR, inputs)
        return
    changed = sorted(k for k in set(seen) | set(inputs) if seen.get(k) != inputs.get(k))
    if not changed or allow_changed:
        return
    was = ", ".join(f"{k}={_short(seen.get(k))}" for k in changed)
    raise MoetuneError(f"study '{study.study_name}' was started with other inputs ({was}); continue it with the "
                       "same --trace and --space, use another --study or --out, or pass --allow-changed-inputs")


def study_inputs(trace: str, space_grid: dict) -> dict:
    """What a study's trials depend on beyond the knobs: the routing trace and the searched space."""
    return {"trace": str(Path(trace).resolve()), "space": json.dumps(space_grid, sort_keys=True, default=str)}


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
