"""The layout holds: no module imports a private name from another, no file-level import loop in
moetune/ (imports inside functions count), and every command is listed where a reader looks for it
(cli/main.py:COMMANDS, the README's command table and Files tree). Each check is also run on a small
bad example, so that it is seen to fail."""

from pathlib import Path

from tests.imports_graph import import_loops, read_graph

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "moetune"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_no_module_imports_a_private_name_from_another():
    assert read_graph(PACKAGE).private == []


def test_the_private_name_check_finds_each_form(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "_hidden = 1\n_other = 2\n__dunder__ = 3\n",
        "pkg/b.py": "from pkg.a import _hidden, __dunder__\n",  # absolute; a dunder is not private
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "def f():\n    from ..a import _other\n",  # relative, inside a function
        "pkg/d.py": "from pkg import a\nfrom pkg.a import _hidden as h\n",  # importing the module is fine
    })
    assert sorted(read_graph(pkg).private) == ["pkg.b imports _hidden from pkg.a", "pkg.d imports _hidden from pkg.a",
                                               "pkg.sub.c imports _other from pkg.a"]


def test_no_file_level_import_loop_in_moetune():
    graph = read_graph(PACKAGE)
    assert len(graph.modules) > 150 and sum(map(len, graph.edges.values())) > 400  # the graph was read
    assert import_loops(graph.edges) == []


def test_the_loop_check_finds_a_loop_held_apart_by_a_function_import(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/plain.py": "def summary():\n    from pkg.ranks.twin import rank_part\n    return rank_part()\n",
        "pkg/ranks/__init__.py": "",
        "pkg/ranks/twin.py": "from pkg.plain import summary\n\ndef rank_part():\n    return 1\n",
        "pkg/x.py": "import pkg.y\n", "pkg/y.py": "from . import z\n", "pkg/z.py": "from pkg import x\n",
        "pkg/leaf.py": "from pkg.plain import summary\n",  # imports into a loop without being in it
    })
    assert sorted(import_loops(read_graph(pkg).edges)) == [["pkg.plain", "pkg.ranks.twin"], ["pkg.x", "pkg.y", "pkg.z"]]


def _typer_commands() -> dict[str, str]:
    """command name → the module of its function, as typer registered them."""
    from moetune.cli.main import app

    return {c.name or c.callback.__name__.replace("_", "-"): c.callback.__module__ for c in app.registered_commands}


def test_every_command_is_in_commands_and_the_readme():
    from moetune.cli.main import COMMANDS

    commands = _typer_commands()
    assert len(commands) >= 13
    assert sorted(COMMANDS) == sorted(commands)
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Commands"):readme.index("## Files")]
    tree = readme[readme.index("  cli/"):readme.index("\n  config.py")]
    for name, module in commands.items():
        assert f"| `moetune {name}" in table, f"{name} has no row in the README's command table"
        assert f"{module.rpartition('.')[2]}.py" in tree, f"{module} is not in the README's Files tree"
    for f in (PACKAGE / "cli").glob("*.py"):
        assert f.name == "__init__.py" or f.name in tree, f"cli/{f.name} is not in the README's Files tree"


def test_no_file_cites_a_design_note_the_repository_lacks():
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert len(files) > 100
    import re

    missing = "DESIGN" + ".md"  # spelled apart so that this file does not cite it
    cite = re.compile("DESIGN" + r"(\.md| §)")  # the file, or one of its sections (name, space, section sign)
    citing = [f for f in files if (ROOT / f).is_file() and f.endswith((".py", ".md", ".toml", ".yaml", ".txt"))
              and cite.search((ROOT / f).read_text(errors="replace"))]
    assert not (ROOT / missing).exists() and citing == []
