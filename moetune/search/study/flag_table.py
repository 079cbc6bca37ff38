"""The argument parsers of the serving engines moetune emits launch commands for, rebuilt from
flag tables dumped from their real parsers (`tools/engine_flag_tables.py dump`, at the version each
table states), so that every emitted command is parsed here as the engine would parse it.

A table row: {"names": ["--tensor-parallel-size", "-tp"], "value": true, "int": true,
"choices": null | [...], "deprecated": false}. `check(engine, argv)` parses argv and refuses
deprecated flags; `commands_of(text)` finds the launch commands in an emitted shell file.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

# The placeholders an emitted multi-node file leaves to the user, and sample values to parse it with.
PLACEHOLDERS = {"$HEAD_IP": "10.0.0.1", "$MODEL_DIR": "/models/m", "$DRAFT_DIR": "/models/draft",
                "$PREFILL_HOST": "10.0.0.2", "$DECODE_HOST": "10.0.0.3", "$HOST": "0.0.0.0", "$PORT": "8000"}
LAUNCHERS = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server",
             "sglang_router": "python -m sglang_router.launch_router"}
NAMES = {"vllm": "vLLM", "sglang": "SGLang", "sglang_router": "SGLang router"}


@dataclass(frozen=True)
class FlagTable:
    engine: str
    version: str
    rows: tuple[dict, ...]

    def row(self, flag: str) -> dict | None:
        return next((r for r in self.rows if flag in r["names"]), None)

    def title(self) -> str:
        return f"{NAMES[self.engine]} {self.version}"


@lru_cache(maxsize=None)
def flag_table(engine: str) -> FlagTable:
    data = json.loads(resources.files("moetune.search.study").joinpath(f"flag_tables/{engine}.json").read_text())
    return FlagTable(data["engine"], data["version"], tuple(data["flags"]))


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # never exit: the caller says what was refused
        raise _Refused(message)


@lru_cache(maxsize=None)
def _parser(engine: str) -> _Parser:
    p = _Parser(prog=LAUNCHERS[engine], add_help=False, allow_abbrev=False)
    if engine == "vllm":
        p.add_argument("model_tag", nargs="?")
    for r in flag_table(engine).rows:
        if r["value"] and "nargs" in r:  # the router's --prefill URL [PORT] / --decode URL, repeated
            p.add_argument(*r["names"], type=str, nargs=r["nargs"], action="append" if r.get("append") else "store")
        elif r["value"]:
            p.add_argument(*r["names"], type=int if r["int"] else str, choices=r["choices"])
        else:
            p.add_argument(*r["names"], action="store_true")
    return p


def check(engine: str, argv: list[str]) -> str | None:
    """Why `argv` (the arguments after the launcher) does not parse for `engine`; None when it does."""
    table = flag_table(engine)
    for arg in argv:
        row = table.row(arg.split("=", 1)[0]) if arg.startswith("-") else None
        if row and row["deprecated"]:
            return f"{arg} is deprecated in {table.title()}"
    try:
        args = _parser(engine).parse_args(argv)
    except _Refused as e:
        return f"{table.title()} refuses it: {e}"
    if engine == "vllm" and getattr(args, "kv_transfer_config", None):
        return kv_transfer_reason(args.kv_transfer_config)
    return None


def kv_transfer_reason(text: str) -> str | None:
    """Why vLLM's KVTransferConfig refuses this --kv-transfer-config JSON (flag_tables/vllm_kv_transfer.json)."""
    spec = json.loads(resources.files("moetune.search.study").joinpath("flag_tables/vllm_kv_transfer.json").read_text())
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return f"--kv-transfer-config is not JSON: {e}"
    unknown = sorted(set(data) - set(spec["fields"]))
    if unknown:
        return f"--kv-transfer-config: KVTransferConfig has no field {unknown[0]!r}"
    for name, choices in spec["fields"].items():
        if choices and name in data and data[name] not in choices:
            return f"--kv-transfer-config: {name} {data[name]!r} is not one of {choices}"
    if data.get("kv_connector") not in spec["connectors"]:
        return f"--kv-transfer-config: connector {data.get('kv_connector')!r} is not one vLLM registers"
    if data.get("kv_role") is None:  # KVTransferConfig.__post_init__: a connector needs a role
        return "--kv-transfer-config: kv_connector set without kv_role"
    return None


def commands_of(text: str) -> list[list[str]]:
    """The argv (after the launcher) of every launch command in an emitted file: lines starting with
    a launcher, continued with a trailing backslash; placeholders take sample values."""
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        launcher = next((v for v in LAUNCHERS.values() if line.startswith(v + " ")), None)
        i += 1
        if launcher is None:
            continue
        parts = [line]
        while parts[-1].endswith("\\") and i < len(lines):
            parts[-1] = parts[-1][:-1]
            parts.append(lines[i].strip())
            i += 1
        joined = " ".join(parts)
        for name, value in PLACEHOLDERS.items():
            joined = joined.replace(name, value)
        out.append(shlex.split(joined[len(launcher):]))
    return out
