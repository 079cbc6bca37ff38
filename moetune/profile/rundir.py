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

from moetune.errors import MoetuneError
from moetune.profile.reader import SCHEMA_VERSION, RunReader
from moetune.profile.tables import TABLES, RunTables
from moetune.profile.trace import RoutingTrace

TRACE_FILE = "routing.npz"


class RunDirWriter:
    """`with RunDirWriter(final) as tmp:` write into tmp; it becomes `final` only on success."""

    def __init__(self, final: Path):
        self.final = Path(final)
        self.tmp: Path | None = None
        self.created: list[Path] = []  # parent folders __enter__ made (removed again on failure)

    def check_free(self) -> None:
        taken = any(self.final.iterdir()) if self.final.is_dir() else self.final.exists()
        if taken:
            raise MoetuneError(f"run directory '{self.final}' already exists; choose another --out")

    def __enter__(self) -> Path:
        self.check_free()
        self.created = [p for p in (self.final.parent, *self.final.parent.parents) if not p.exists()]  # deepest first
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", suffix=".tmp", dir=self.final.parent))
        self.tmp.chmod(0o755)  # mkdtemp makes it private; a run dir is an ordinary directory
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            for parent in self.created:  # the folders made for it, when nothing else landed there
                try:
                    parent.rmdir()
                except OSError:
                    break
            return False
        if self.final.is_dir():
            self.final.rmdir()  # empty (checked on entry)
        os.rename(self.tmp, self.final)
        return False


def write_contents(root: Path, recipe_yaml: str, env: dict, summary: dict, tables: RunTables,
                   trace: RoutingTrace) -> None:
    (root / "recipe.yaml").write_text(recipe_yaml)
    (root / "env.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    versioned = {"schema_version": SCHEMA_VERSION, **{k: v for k, v in summary.items() if k != "schema_version"}}
    (root / "summary.json").write_text(json.dumps(versioned, indent=2, default=_jsonable) + "\n")
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
    """Every file through one `RunReader`: a missing, corrupt or other-version file is one line."""
    reader = RunReader(path)
    reader.require(["recipe.yaml", "env.json", "summary.json", TRACE_FILE] + [f"{t}.parquet" for t in TABLES])
    summary = reader.summary()  # schema version first: another version is refused, not misread
    tables = RunTables(**{name: reader.table(name) for name in TABLES})
    return RunData(reader.path, reader.text("recipe.yaml"), reader.json("env.json"), summary, tables,
                   reader.trace(TRACE_FILE))
