"""`pip install -e ".[serve]"` (the README's install) is enough for `serve` and `bench-serve`: every
third-party module their CLI modules reach through moetune's imports (function-level ones too) is a
base dependency or in the `serve` extra (bench-serve once crashed with ModuleNotFoundError: httpx,
which only the `test` extra had)."""

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ("moetune.cli.serve", "moetune.cli.bench_serve")  # the two commands; every moetune module they import follows
MODULE_DIST = {"prometheus_client": "prometheus-client", "yaml": "pyyaml", "pynvml": "nvidia-ml-py",
               "starlette": "fastapi", "h11": "uvicorn",  # import name → the distribution bringing it (h11: uvicorn's)
               "llvmlite": "numba"}  # numba's own compiler (kernels/cpu: _simd.py's intrinsics, isa.py's target CPU)
# Reached only through search/simulate's measured GPU tables (search/cost/op_tables.py imports it inside the
# functions that load the tables, and prices the roofline without it): the `gpu-db` extra, never needed to serve.
OPTIONAL = {"aiconfigurator_core": "gpu-db"}


def module_file(name: str) -> Path | None:
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports(path: Path) -> set[str]:
    """Every module imported anywhere in the file, by full name (`from pkg import mod` gives pkg.mod too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def third_party_reached() -> set[str]:
    """Top-level third-party modules imported by the entry modules and every moetune module they reach."""
    seen, todo, outside = set(), list(ENTRY), set()
    while todo:
        name = todo.pop()
        path = module_file(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        for imported in imports(path):
            top = imported.split(".")[0]
            if top == "moetune":
                todo.append(imported)
            elif top not in sys.stdlib_module_names and top != "__future__":
                outside.add(top)
    return outside


def dists(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def test_serve_and_bench_serve_need_only_the_serve_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    have = dists(project["dependencies"]) | dists(project["optional-dependencies"]["serve"])
    reached = third_party_reached()
    extras = project["optional-dependencies"]
    for module, extra in OPTIONAL.items():  # an optional extra's module: declared in that extra, not needed to serve
        assert module.replace("_", "-") in dists(extras[extra]), (module, extra)
    needed = {MODULE_DIST.get(m, m) for m in reached - set(OPTIONAL)}
    assert {"httpx", "fastapi", "uvicorn"} <= needed  # the walk reaches bench-serve's client and the server
    assert needed <= have, f"reached by serve/bench-serve but not in the serve extra: {sorted(needed - have)}"
