"""Whether a vLLM defines a name, read from its source files without importing it.

Why from source: the names lorabench touches must be checked against releases that cannot
be imported here (vLLM 0.23 needs a torch this machine lacks, an NPU build needs CANN), and
against the installed vLLM without paying its import (seconds) or initializing a device
runtime in the pytest process. A name is found the way Python would find it when the code
runs: a module's top-level definitions and imports (under ``if``/``try`` too, where vLLM keeps
its lazy exports), a class's body, the attributes its methods set on ``self``, and the classes
it derives from inside vLLM. Anything defined by code that runs (``setattr``, a metaclass)
is not seen: the manifest names only what vLLM writes out.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

_BLOCKS = (ast.If, ast.Try, ast.With)


class Source:
    """A vLLM tree: ``root`` is the folder that holds the ``vllm`` package."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._parsed: dict[str, ast.Module | None] = {}

    def module(self, dotted: str) -> ast.Module | None:
        """The parsed module ``dotted`` (``vllm.v1.engine.async_llm``), None where there is no such file."""
        if dotted not in self._parsed:
            base = self.root.joinpath(*dotted.split("."))
            found = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
            self._parsed[dotted] = ast.parse(found.read_text(encoding="utf-8")) if found else None
        return self._parsed[dotted]

    def has_module(self, dotted: str) -> bool:
        return self.module(dotted) is not None

    def has(self, dotted: str, qualname: str) -> bool:
        """Whether ``dotted`` gives ``qualname``: ``AsyncLLM``, ``AsyncLLM.collective_rpc``,
        a field ``LoRARequest.load_inplace``, or a parameter ``AsyncLLM.from_engine_args(stat_loggers)``."""
        name, _, param = qualname.partition("(")
        found = self._lookup(dotted, name.split("."), depth=0)
        if found is None or not param:
            return found is not None
        wanted = param.rstrip(")")
        return isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef) and wanted in _parameters(found)

    def mentions(self, dotted: str, text: str) -> bool:
        """Whether ``dotted`` has the string constant ``text`` itself (a metric's name as vLLM
        writes it, ``vllm:prefix_cache_hits``, which Prometheus serves as ``..._total``): not a
        log message that names it."""
        tree = self.module(dotted)
        strings = (n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)) if tree is not None else ()
        return any(s == text for s in strings)

    def _lookup(self, dotted: str, parts: list[str], depth: int) -> ast.AST | None:
        tree = self.module(dotted)
        if tree is None or depth > 8:
            return None
        node = _top_level(tree, parts[0])
        if isinstance(node, ast.ImportFrom):
            target = _imported_module(dotted, node, self._is_package(dotted))
            if target is None:
                return None
            return self._lookup(target, [_original(node, parts[0]), *parts[1:]], depth + 1)
        if node is None:
            return self._lazy_export(tree, dotted, parts, depth)
        for part in parts[1:]:
            if not isinstance(node, ast.ClassDef):
                return None
            node = self._member(dotted, node, part, depth)
            if node is None:
                return None
        return node

    def _member(self, dotted: str, cls: ast.ClassDef, name: str, depth: int) -> ast.AST | None:
        """``name`` in ``cls``'s body, set on ``self`` in a method, or in a base class in vLLM."""
        own = _class_member(cls, name)
        if own is not None:
            return own
        for base in cls.bases:
            if isinstance(base, ast.Name):
                found = self._lookup(dotted, [base.id, name], depth + 1)
                if found is not None:
                    return found
        return None

    def _lazy_export(self, tree: ast.Module, dotted: str, parts: list[str], depth: int) -> ast.AST | None:
        """vLLM's package ``__init__`` exports names lazily from a table ``{"Name": ".module:Name"}``;
        a module's ``__getattr__`` that answers the name (``vllm.platforms.current_platform``)."""
        getter = _top_level(tree, "__getattr__")
        if len(parts) == 1 and isinstance(getter, ast.FunctionDef):
            if any(isinstance(n, ast.Constant) and n.value == parts[0] for n in ast.walk(getter)):
                return getter
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == parts[0] and isinstance(value, ast.Constant):
                        module, _, attr = str(value.value).partition(":")
                        target = dotted + module if module.startswith(".") else module
                        return self._lookup(target, [attr or parts[0], *parts[1:]], depth + 1)
        return None

    def _is_package(self, dotted: str) -> bool:
        return self.root.joinpath(*dotted.split("."), "__init__.py").is_file()


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    """The last top-level statement that binds ``name`` (inside ``if``/``try`` blocks too)."""
    found = None
    for node in _statements(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign | ast.AnnAssign) and name in _targets(node):
            found = node
        elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            found = found if isinstance(found, ast.ClassDef | ast.FunctionDef) else node
    return found


def _statements(body: list[ast.stmt]):
    """The statements that run, ``if``/``try``/``with`` blocks opened; not the body of an
    ``if TYPE_CHECKING:`` or ``if False:``, whose imports a type checker sees and Python never runs."""
    for node in body:
        if isinstance(node, ast.If) and _never(node.test):
            yield from _statements(node.orelse)
        elif isinstance(node, _BLOCKS):
            yield from _statements(node.body)
            for handler in getattr(node, "handlers", []):
                yield from _statements(handler.body)
            yield from _statements(getattr(node, "orelse", []))
        else:
            yield node


def _never(test: ast.expr) -> bool:
    """``TYPE_CHECKING``, ``typing.TYPE_CHECKING`` or ``False``: a block that never runs."""
    if isinstance(test, ast.Constant):
        return test.value is False
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name == "TYPE_CHECKING"


def _targets(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _class_member(cls: ast.ClassDef, name: str) -> ast.AST | None:
    for node in _statements(cls.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.Assign | ast.AnnAssign) and name in _targets(node):
            return node
    for method in cls.body:
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(method):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                if isinstance(node, ast.Assign | ast.AnnAssign) and any(_sets_self(t, name) for t in targets):
                    return node
    return None


def _sets_self(target: ast.AST | None, name: str) -> bool:
    return isinstance(target, ast.Attribute) and target.attr == name and getattr(target.value, "id", "") == "self"


def _parameters(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = func.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def _imported_module(dotted: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    """The module a ``from ... import`` in ``dotted`` reads from; None outside vLLM."""
    if node.level == 0:
        return node.module if node.module and node.module.split(".")[0] == "vllm" else None
    base = dotted.split(".") if is_package else dotted.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *(node.module.split(".") if node.module else [])])


def _original(node: ast.ImportFrom, name: str) -> str:
    return next(a.name for a in node.names if (a.asname or a.name) == name)


@cache
def installed() -> Source | None:
    """The installed vLLM's tree, found as an import would find it but not imported; None
    where there is no vLLM, or it does not load from plain files."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Source(Path(locations[0]).parent) if locations else None
