"""The import graph of the lorabench package, read from the source (no module imported):
no circles, and the command line imported by nothing but ``python -m lorabench``.

Every import counts: at the top, inside a function, under ``TYPE_CHECKING``. A circle
through a lazy import still ties the two modules together, and it turns into an import
error the day someone moves the import to the top.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "lorabench"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, here: str, is_package: bool, modules: set[str]) -> Iterator[str]:
    """The package's modules that ``tree`` imports; ``from X import name`` counts as
    importing ``X.name`` where that is a module, else ``X``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = imported(tree, name, path.name == "__init__.py", set(files))
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each group of modules that import one another (Tarjan's strongly
    connected components), as the path ``a -> b -> ... -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_path_round(graph, group) for group in groups]


def _path_round(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest way from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    return sorted(group)


def test_the_package_imports_no_circle():
    found = [" -> ".join(c) for c in circles(import_graph())]
    assert not found, "import circles:\n  " + "\n  ".join(found)


def test_only_python_m_lorabench_imports_the_command_line():
    importers = sorted(m for m, targets in import_graph().items() if "lorabench.cli" in targets)
    assert importers == ["lorabench.__main__"]


def test_the_check_sees_lazy_and_type_checking_imports(tmp_path):
    """The check itself, on a made-up package: a circle closed by an import inside a
    function and one closed under TYPE_CHECKING are both found."""
    source = {
        "a": "import p.b\n",
        "b": "def f():\n    from p import c\n",
        "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import X\n",
        "d": "from . import e\n",
        "e": "from .d import Y\n",
    }
    names = {f"p.{name}" for name in source}
    graph = {
        f"p.{name}": set(imported(ast.parse(text), f"p.{name}", False, names | {"p"})) & names
        for name, text in source.items()
    }
    assert sorted(circles(graph)) == [["p.a", "p.b", "p.c", "p.a"], ["p.d", "p.e", "p.d"]]
