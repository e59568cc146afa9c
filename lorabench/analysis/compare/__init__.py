"""Compare two benchmark runs: ``load`` reads them, ``analysis`` decides what changed,
``render`` shows it.

The names below are imported when first used, not with the package: the comparison's
options (``compare.options``), which the pytest plugin adds at every start, need no
pandas, and importing it took a third of a second of each pytest and lorabench start."""

from __future__ import annotations

import importlib
from typing import Any


class CompareError(Exception):
    """Input that cannot be compared (files, options); the CLI exits with status 2."""


_WHERE = {
    "analysis": (
        "IMPROVED",
        "NOT_SIGNIFICANT",
        "REGRESSED",
        "TOO_FEW",
        "WITHIN",
        "Comparison",
        "Finding",
        "Noise",
        "compare",
    ),
    "load": ("Run", "find_runs", "load_noise_runs", "load_run", "split_paths"),
    "options": ("DEFAULT_ALPHA", "DEFAULT_THRESHOLD", "parse_thresholds"),
    "paired": ("compare_pairs", "is_ab_side"),
    "render": ("RENDERERS", "plot", "render_by_rank", "render_text"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted([*_MODULE_OF, "CompareError"])


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
