"""One option vocabulary (moetune/cli/options.py): every command that loads a model takes the shared
options, booleans are `--flag/--no-flag`, and the README's command table has one short row per command
(read from the typer app, not from a list kept beside it). Every option is documented once, in the
generated docs/cli.md (tests/docs/test_cli_doc.py keeps it current)."""

import re
from pathlib import Path

import pytest
import typer

from moetune.cli.main import COMMANDS, app
from moetune.cli.options import DEVICE, EP, SOURCE, TP

README = Path(__file__).resolve().parents[2] / "README.md"
CLI = typer.main.get_command(app)


def names(group) -> set[str]:
    return {"--" + name.replace("_", "-") for name, _, _ in group}


def options(command: str) -> dict:
    return {o.opts[0]: o for o in CLI.commands[command].params if o.param_type_name == "option"}


# command → the shared groups it takes (quantize reads a checkpoint and runs nothing: no --dtype/--device)
LOADING = {"generate": SOURCE + DEVICE + EP + TP, "bench": SOURCE + DEVICE + EP + TP,
           "profile": SOURCE + DEVICE + EP + TP, "serve": SOURCE + DEVICE + EP, "eval": SOURCE + DEVICE,
           "tune-kernels": SOURCE + DEVICE, "quantize": SOURCE}


@pytest.mark.parametrize("command", sorted(LOADING))
def test_every_model_loading_command_takes_the_shared_options_from_one_definition(command):
    got = options(command)
    assert names(LOADING[command]) <= set(got)
    for name, _, opt in LOADING[command]:  # the same help and default, wherever it is taken
        assert got["--" + name.replace("_", "-")].help == opt.help


@pytest.mark.parametrize("command", COMMANDS)
def test_booleans_are_flag_no_flag_and_show_no_value(command):
    for opt in options(command).values():
        if opt.is_flag and opt.opts[0] != "--help":
            assert opt.secondary_opts == ["--no-" + opt.opts[0][2:]], opt.opts
            assert opt.metavar == "", opt.opts


def readme_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in README.read_text().split("## Commands", 1)[1].split("\n## ", 1)[0].splitlines():
        m = re.match(r"\| `moetune ([\w-]+)(.*?)` \|", line)
        if m:
            rows[m.group(1)] = (line, m.group(2))
    return rows


def test_the_readme_table_has_one_short_row_per_command_naming_only_real_options():
    rows = readme_rows()
    assert set(rows) == set(COMMANDS)
    for command, (line, usage) in rows.items():
        assert len(line) <= 100, f"{command}: the README's row is {len(line)} characters (at most 100)"
        flags = set(re.findall(r"--[a-z][\w-]*", usage))
        real = {name for o in CLI.commands[command].params for name in (*o.opts, *getattr(o, "secondary_opts", []))}
        assert flags <= real, f"{command}: the README names {sorted(flags - real)}, which it does not take"


def test_the_readme_points_to_the_generated_option_reference():
    assert "docs/cli.md" in README.read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]


def test_an_option_name_means_one_kind_of_value_on_every_command():
    """--trace was a run directory in search/simulate and a torch-profiler switch in profile (issue 29):
    a name is a flag everywhere or takes a value everywhere."""
    kinds: dict[str, set[bool]] = {}
    for command in COMMANDS:
        for name, opt in options(command).items():
            kinds.setdefault(name, set()).add(bool(opt.is_flag))
    assert not {n for n, k in kinds.items() if len(k) > 1}
    assert options("profile")["--torch-trace"].is_flag and not options("search")["--trace"].is_flag
