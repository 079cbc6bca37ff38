"""docs/cli.md is generated from the typer app (tools/gen_cli_docs.py) and must be current: a new or
changed option fails here until the page is regenerated, with the command that does it."""

import importlib.util
from pathlib import Path

import typer

from moetune.cli.main import COMMANDS, app

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cli.md"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "tools" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_current():
    gen = _generator()
    assert DOC.read_text() == gen.render(), f"docs/cli.md is stale: run `{gen.COMMAND}`"


def test_docs_cli_md_has_every_command_and_every_option_with_its_help():
    text = DOC.read_text()
    cli = typer.main.get_command(app)
    for name in COMMANDS:
        section = text.split(f"\n## moetune {name}\n", 1)[1].split("\n## ", 1)[0]
        for p in cli.commands[name].params:
            if p.param_type_name == "option" and p.opts[0] != "--help":
                item = next((line for line in section.splitlines() if line.startswith(f"- `{p.opts[0]}`")), None)
                assert item is not None, f"{name}: {p.opts[0]} is not in docs/cli.md"
                if p.help:
                    assert p.help.split()[0] in item, (name, p.opts[0], item)


def test_the_check_mode_says_how_to_regenerate(tmp_path, capsys, monkeypatch):
    gen = _generator()
    stale = tmp_path / "cli.md"
    stale.write_text("old\n")
    monkeypatch.setattr(gen, "OUT", stale)
    assert gen.main(["--check"]) == 1
    assert "python tools/gen_cli_docs.py" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0 and stale.read_text() == gen.render()
