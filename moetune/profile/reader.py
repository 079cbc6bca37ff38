"""The one reader of run directories: every file goes through `RunReader`, and every way a file can
be wrong (missing, unreadable, corrupt, missing a column or key, another schema version) becomes one
`RunDirError` line naming the file and what to do.

`SCHEMA_VERSION` is written as `schema_version` in summary.json (SCHEMA.md); a run directory
written with another version is refused rather than misread.
"""

from __future__ import annotations

import json
from pathlib import Path

from moetune.errors import RunDirError

SCHEMA_VERSION = 2
RERUN = "re-run `moetune profile` to write it again"

TABLE_COLUMNS = {
    "steps": ("step", "kind", "batch", "tokens", "context_tokens", "attn_pairs", "seconds"),
    "phases": ("step", "kind", "layer", "phase", "seconds"),
    "layers": ("step", "kind", "layer", "seconds"),
    "moe": ("step", "kind", "layer", "tokens", "rows", "padded_rows"),
    "expert_load": ("step", "kind", "layer", "expert", "tokens"),
    "ep_ranks": ("step", "kind", "layer", "rank", "copies", "send_bytes", "recv_bytes"),
    "ep_traffic": ("step", "kind", "layer", "same_rank_bytes", "intra_node_bytes", "inter_node_bytes"),
    "nvml": ("t", "memory_used_bytes", "gpu_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz"),
    "rank_steps": ("step", "kind", "rank", "rank_kind", "batch", "tokens", "seconds"),
    "rank_moe": ("step", "kind", "layer", "rank", "tokens", "copies_sent", "copies_in", "dispatch_seconds",
                 "combine_seconds", "moe_seconds", "wait_seconds", "transfer_seconds", "dispatch_bytes",
                 "combine_bytes", "same_rank_bytes", "intra_node_bytes", "inter_node_bytes"),
    "rank_tp": ("step", "kind", "layer", "rank", "dp_rank", "tp_rank", "phase", "tokens", "batch", "calls", "seconds",
                "bytes"),  # only in runs on a tensor-parallel mesh
}
SUMMARY_KEYS = ("kinds", "model", "workload", "parallel", "memory", "nvml")


class RunReader:
    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_dir():
            what = "is a file" if self.path.exists() else "does not exist"
            raise RunDirError(f"run directory '{self.path}' {what}; pass a directory written by `moetune profile`")

    def require(self, names: list[str]) -> None:
        missing = [name for name in names if not (self.path / name).is_file()]
        if missing:
            raise RunDirError(f"'{self.path}' is not a complete run directory (missing {', '.join(missing)}); {RERUN}")

    def _fail(self, name: str, problem: str) -> RunDirError:
        return RunDirError(f"run directory '{self.path}': {name} {problem}; {RERUN}")

    def text(self, name: str) -> str:
        self.require([name])
        try:
            return (self.path / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise self._fail(name, "is not UTF-8 text (corrupt)") from None
        except OSError as exc:
            raise self._fail(name, f"cannot be read ({exc.strerror})") from None

    def json(self, name: str) -> dict:
        try:
            data = json.loads(self.text(name))
        except json.JSONDecodeError as exc:
            raise self._fail(name, f"is corrupt (not JSON: {exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise self._fail(name, f"is corrupt (a JSON {type(data).__name__}, expected an object)")
        return data

    def summary(self) -> dict:
        name = "summary.json"
        data = self.json(name)
        version = data.get("schema_version")
        if version is None:
            raise self._fail(name, f"has no schema_version (written before version {SCHEMA_VERSION})")
        if version != SCHEMA_VERSION:
            raise self._fail(name, f"has schema_version {json.dumps(version)}; this moetune reads version "
                             f"{SCHEMA_VERSION}")
        missing = [k for k in SUMMARY_KEYS if not isinstance(data.get(k), dict)]
        if missing:
            raise self._fail(name, f"lacks the '{missing[0]}' section (corrupt)")
        return data

    def table(self, table: str):
        import pandas as pd

        name = f"{table}.parquet"
        self.require([name])
        try:
            df = pd.read_parquet(self.path / name)
        except Exception as exc:  # pyarrow raises many types for a damaged file; all mean "corrupt"
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise self._fail(name, f"is corrupt (not Parquet: {first})") from None
        missing = [c for c in TABLE_COLUMNS.get(table, ()) if c not in df.columns]
        if missing:
            raise self._fail(name, f"lacks column '{missing[0]}' (corrupt or another schema)")
        return df

    def trace(self, name: str):
        from moetune.profile.trace import RoutingTrace

        self.require([name])
        try:
            trace = RoutingTrace.load(self.path / name)
        except Exception as exc:  # zipfile, zlib, numpy and KeyError all mean a damaged archive
            raise self._fail(name, f"is corrupt ({type(exc).__name__}: {exc})") from None
        ranks_ok = trace.token_rank is None or len(trace.token_rank) == len(trace.topk_ids)
        if len(trace.step_offsets) != trace.num_steps + 1 or trace.topk_ids.ndim != 3 or not ranks_ok:
            raise self._fail(name, "is corrupt (arrays of inconsistent sizes)")
        return trace
