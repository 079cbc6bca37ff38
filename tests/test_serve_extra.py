"""`pip install -e ".[serve]"` (the README's install) is enough for `serve` and `bench-serve`: every
third-party module imported anywhere in moetune/serve/ and their CLI modules is a base dependency
or in the `serve` extra (bench-serve once crashed with ModuleNotFoundError: httpx, which only the
`test` extra had)."""

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FILES = [*sorted((ROOT / "moetune" / "serve").glob("*.py")), ROOT / "moetune" / "cli" / "serve.py",
         ROOT / "moetune" / "cli" / "bench_serve.py"]
MODULE_DIST = {"prometheus_client": "prometheus-client", "yaml": "pyyaml", "starlette": "fastapi",
               "pydantic": "pydantic"}  # import name → the distribution that provides it (starlette: fastapi's)


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"moetune", "__future__"}


def dists(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def test_serve_and_bench_serve_need_only_the_serve_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    have = dists(project["dependencies"]) | dists(project["optional-dependencies"]["serve"])
    needed = {MODULE_DIST.get(m, m) for f in FILES for m in imported(f)}
    assert "httpx" in needed  # the check reads bench-serve's client
    assert needed <= have, f"imported by serve/bench-serve but not in the serve extra: {sorted(needed - have)}"
