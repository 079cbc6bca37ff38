"""Run directory: write atomically (temp dir → rename), read back into the same tables.

Layout and columns: SCHEMA.md next to this file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moetune.errors import MoetuneError
from moetune.profile.tables import TABLES, RunTables
from moetune.profile.trace import RoutingTrace

TRACE_FILE = "routing.npz"


class RunDirWriter:
    """`with RunDirWriter(final) as tmp:` write into tmp; it becomes `final` only on success."""

    def __init__(self, final: Path):
        self.final = Path(final)
        self.tmp: Path | None = None

    def check_free(self) -> None:
        taken = any(self.final.iterdir()) if self.final.is_dir() else self.final.exists()
        if taken:
            raise MoetuneError(f"run directory '{self.final}' already exists; choose another --out")

    def __enter__(self) -> Path:
        self.check_free()
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", suffix=".tmp", dir=self.final.parent))
        self.tmp.chmod(0o755)  # mkdtemp makes it private; a run dir is an ordinary directory
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        if self.final.is_dir():
            self.final.rmdir()  # empty (checked on entry)
        os.rename(self.tmp, self.final)
        return False


def write_contents(root: Path, recipe_yaml: str, env: dict, summary: dict, tables: RunTables,
                   trace: RoutingTrace) -> None:
    (root / "recipe.yaml").write_text(recipe_yaml)
    (root / "env.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    (root / "summary.json").write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n")
    for name, df in tables.items():
        df.to_parquet(root / f"{name}.parquet", index=False)
    trace.save(root / TRACE_FILE)


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


@dataclass
class RunData:
    path: Path
    recipe_yaml: str
    env: dict
    summary: dict
    tables: RunTables
    trace: RoutingTrace


def read_run(path: Path) -> RunData:
    path = Path(path)
    required = ["recipe.yaml", "env.json", "summary.json", TRACE_FILE] + [f"{t}.parquet" for t in TABLES]
    if not path.is_dir():
        raise MoetuneError(f"run directory '{path}' does not exist; pass a directory written by `moetune profile`")
    missing = [name for name in required if not (path / name).is_file()]
    if missing:
        raise MoetuneError(f"'{path}' is not a complete run directory (missing {', '.join(missing)})")
    tables = RunTables(**{name: pd.read_parquet(path / f"{name}.parquet") for name in TABLES})
    return RunData(path, (path / "recipe.yaml").read_text(), json.loads((path / "env.json").read_text()),
                   json.loads((path / "summary.json").read_text()), tables, RoutingTrace.load(path / TRACE_FILE))
