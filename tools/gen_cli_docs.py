"""Write docs/cli.md from the typer app: every command (in cli/main.py's COMMANDS order), its help, its
usage, and every argument and option with its help, type and default, read from the click objects typer
builds, so the page cannot drift from `--help`.

    python tools/gen_cli_docs.py           # rewrite docs/cli.md
    python tools/gen_cli_docs.py --check   # exit 1, saying so, when docs/cli.md is stale

tests/docs/test_cli_doc.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "cli.md"
COMMAND = "python tools/gen_cli_docs.py"
WIDTH = 100
TYPES = {"str": "text", "int": "integer", "float": "number", "bool": "flag", "Path": "path"}


def render() -> str:
    """The whole of docs/cli.md."""
    import typer

    sys.path.insert(0, str(ROOT))
    from moetune.cli.main import COMMANDS, app

    cli = typer.main.get_command(app)
    out = ["# `moetune` commands and options", "",
           f"<!-- generated from the typer app by `{COMMAND}`; edit the commands, not this file -->", "",
           *_wrap("Every command, every option with its type, default and help, as `moetune COMMAND --help` "
                  "gives them. The README's table says what each command is for; the conventions every "
                  "command shares (shared options, exit codes, progress, piped output) are in the README too."),
           "", *[f"- [`moetune {name}`](#moetune-{name})" for name in COMMANDS], ""]
    for name in COMMANDS:
        out += _command(name, cli.commands[name])
    return "\n".join(out).rstrip() + "\n"


def _command(name: str, cmd) -> list[str]:
    params = [p for p in cmd.params if "--help" not in p.opts]
    args = [p for p in params if p.param_type_name == "argument"]
    opts = [p for p in params if p.param_type_name == "option"]
    usage = " ".join(["moetune", name, *(_arg_usage(a) for a in args), *(_required(o) for o in opts if o.required),
                      *(["[OPTIONS]"] if any(not o.required for o in opts) else [])])
    lines = [f"## moetune {name}", "", *_wrap(_help(cmd.help)), "", f"`{usage}`", ""]
    for p in args:
        lines += _item(f"`{p.name.upper()}`", _describe(p), getattr(p, "help", "") or "")
    for p in opts:
        names = ", ".join(f"`{n}`" for n in (*p.opts, *p.secondary_opts))
        lines += _item(names, _describe(p), p.help or "")
    return lines + [""]


def _arg_usage(a) -> str:
    text = a.name.upper() + ("..." if a.nargs == -1 else "")
    return text if a.required else f"[{text}]"


def _required(o) -> str:
    return o.opts[0] if o.is_flag else f"{o.opts[0]} {_kind(o).split()[0].upper()}"


def _describe(p) -> str:
    """(type, required | default): the value's kind and what it is when not given."""
    kind = "flag" if getattr(p, "is_flag", False) else _kind(p)
    if p.multiple or p.nargs == -1:
        kind += ", repeatable"
    if p.required:
        return f"{kind}, required"
    default = p.default
    if callable(default):
        return f"{kind}, default computed"
    if getattr(p, "is_flag", False):
        return f"{kind}, default {'on' if default else 'off'}"
    if default is None or default == () or default == []:
        return kind
    return f"{kind}, default `{default}`"


def _kind(p) -> str:
    """The value's type from the parameter's annotation (List[X] → X), with its bounds."""
    import typing

    annotation = p.type_descriptor.annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (list, tuple) and args:
        annotation = args[0]
    name = TYPES.get(getattr(annotation, "__name__", str(annotation)), str(annotation))
    if p.min is not None and p.max is not None:
        return f"{name} {p.min}..{p.max}"
    if p.min is not None or p.max is not None:
        return f"{name} ≥ {p.min}" if p.min is not None else f"{name} ≤ {p.max}"
    return name


def _help(text: str | None) -> str:
    return " ".join((text or "").split())


def _item(names: str, kind: str, help: str) -> list[str]:
    return textwrap.wrap(f"- {names} ({kind}): {_help(help)}".rstrip(": "), WIDTH, subsequent_indent="  ",
                         break_on_hyphens=False, break_long_words=False)


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, break_on_hyphens=False, break_long_words=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 when docs/cli.md differs; write nothing.")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"docs/cli.md is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
