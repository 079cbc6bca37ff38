"""The file-level import graph of a package on disk, read with `ast` (nothing is imported).

Every import statement counts, also those inside functions (a loop held apart by an import inside a
function is still a loop). `from pkg import name` is an edge to `pkg.name` when that is a module, else
to `pkg`. Used by tests/test_structure.py on moetune/ and on small bad examples."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Graph:
    modules: dict[str, Path]  # dotted name → file
    edges: dict[str, set[str]] = field(default_factory=dict)  # importer → imported modules of the package
    private: list[str] = field(default_factory=list)  # "a imports _x from b", b another module


def module_name(root: Path, f: Path) -> str:
    parts = f.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_graph(root: Path) -> Graph:
    """root: the package directory (its name is the top-level package)."""
    g = Graph({module_name(root, f): f for f in sorted(root.rglob("*.py"))})
    for name, f in g.modules.items():
        g.edges[name] = set()
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                g.edges[name] |= {a.name for a in node.names if a.name in g.modules and a.name != name}
            elif isinstance(node, ast.ImportFrom):
                _from_import(g, name, _absolute(node, package), node.names)
    return g


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _from_import(g: Graph, importer: str, base: str, names: list[ast.alias]) -> None:
    for alias in names:
        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in g.modules else base
        if target not in g.modules or target == importer:
            continue
        g.edges[importer].add(target)
        if alias.name.startswith("_") and not alias.name.startswith("__") and target == base:
            g.private.append(f"{importer} imports {alias.name} from {target}")


def import_loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    loops.append(sorted(component))
    return loops
