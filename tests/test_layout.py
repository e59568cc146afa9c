"""The house's size rules (docs/extending.md#layers): a module a reader takes in at one
sitting, a function on one screen. Checked here so that the quick loop catches a module
that grows past them, not a reviewer a month later."""

from __future__ import annotations

import ast

from tests.helpers import ROOT

MODULE_MAX_LINES = 300
# "About 50": a function a few lines over is read on one screen still.
FUNCTION_MAX_LINES = 55


def modules():
    return sorted((ROOT / "lorabench").rglob("*.py"))


def test_no_module_is_over_300_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_MAX_LINES
    }
    assert long == {}, f"split these modules by what they own: {long}"


def test_no_function_is_over_about_50_lines():
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_MAX_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert long == {}, f"split these functions: {long}"
