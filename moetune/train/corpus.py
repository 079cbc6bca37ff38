"""The training corpus: `*.py` files of the running interpreter's standard library.

Selection (all paths relative to ``sysconfig.get_paths()["stdlib"]``, '/'-separated):
  * keep files whose name ends in ``.py``;
  * drop any file under a top-level directory listed in ``exclude_top_dirs``
    (site-packages, test suites, IDLE, lib2to3, generated tables, ...) or starting with ``config-``;
  * drop any file with a directory component in ``exclude_dir_names`` (``test``, ``tests``, ...);
  * drop files whose name starts with a prefix in ``exclude_file_prefixes`` (``_sysconfigdata``: machine specific).
Split: a file is held out iff ``int(sha1(relpath).hexdigest(), 16) % modulus == bucket``.
Files are always handled in sorted relpath order.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CorpusRule:
    exclude_top_dirs: tuple[str, ...] = ()
    exclude_dir_names: tuple[str, ...] = ("test", "tests", "__pycache__")
    exclude_file_prefixes: tuple[str, ...] = ("_sysconfigdata",)
    heldout_modulus: int = 20
    heldout_bucket: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "CorpusRule":
        keys = ("exclude_top_dirs", "exclude_dir_names", "exclude_file_prefixes")
        kw = {k: tuple(d[k]) for k in keys if k in d}
        kw.update({k: int(d[k]) for k in ("heldout_modulus", "heldout_bucket") if k in d})
        return cls(**kw)


@dataclass
class Split:
    root: Path
    train: list[str] = field(default_factory=list)
    heldout: list[str] = field(default_factory=list)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_selected(relpath: str, rule: CorpusRule) -> bool:
    parts = relpath.split("/")
    dirs, name = parts[:-1], parts[-1]
    if not name.endswith(".py"):
        return False
    if dirs and (dirs[0] in rule.exclude_top_dirs or dirs[0].startswith("config-")):
        return False
    if any(d in rule.exclude_dir_names for d in dirs):
        return False
    return not name.startswith(tuple(rule.exclude_file_prefixes))


def is_selected_dir(name: str, top: bool, rule: CorpusRule) -> bool:
    """Directory pruning that agrees with is_selected (only speeds up the walk)."""
    if top and (name in rule.exclude_top_dirs or name.startswith("config-")):
        return False
    return name not in rule.exclude_dir_names


def list_files(root: Path, rule: CorpusRule) -> list[str]:
    """All selected relpaths under root, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        dirnames[:] = sorted(d for d in dirnames if is_selected_dir(d, rel_dir == ".", rule))
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if is_selected(rel, rule):
                out.append(rel)
    return sorted(out)


def is_heldout(relpath: str, rule: CorpusRule) -> bool:
    h = int(hashlib.sha1(relpath.encode("utf-8")).hexdigest(), 16)
    return h % rule.heldout_modulus == rule.heldout_bucket


def split_files(relpaths: list[str], rule: CorpusRule, root: Path) -> Split:
    split = Split(root=root)
    for rel in sorted(relpaths):
        (split.heldout if is_heldout(rel, rule) else split.train).append(rel)
    return split


def make_split(rule: CorpusRule, root: Path | None = None) -> Split:
    root = Path(root) if root is not None else stdlib_root()
    return split_files(list_files(root, rule), rule, root)


def read_text(root: Path, relpath: str) -> str:
    """File text as UTF-8 (undecodable bytes replaced), line endings normalised to '\\n'."""
    raw = (Path(root) / relpath).read_bytes()
    return raw.decode("utf-8", errors="replace").replace("\r\n", "\n")


def read_docs(root: Path, relpaths: list[str]) -> list[str]:
    return [read_text(root, rel) for rel in relpaths]
