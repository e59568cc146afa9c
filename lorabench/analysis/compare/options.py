"""The comparison's options, declared once: ``lorabench compare`` and ``lorabench ab`` add them
to argparse, and the pytest plugin adds them prefixed (``--bench-compare-threshold``), so the
two can never drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FORMATS = ("text", "markdown", "csv", "json")  # the renderers of compare/show.py
THRESHOLD_HELP = "smallest change that counts, default 10%%; repeat per metric, e.g. decode_ms=5%%"
ALPHA_HELP = "significance level after adjustment: the chance that two same-code runs flag anything (default 0.05)"
NOISE_FROM_HELP = (
    "earlier runs of one commit (a folder of result CSVs, or A.csv,B.csv): when each side is one run, "
    "the spread between them is a floor under the noise, so drift between runs is not called a change"
)


def parse_alpha(text: str) -> float:
    """``--alpha``: a significance level, strictly between 0 and 1."""
    try:
        alpha = float(text)
    except ValueError:
        raise ValueError("expected a number such as 0.05") from None
    if not 0 < alpha < 1:
        raise ValueError("a significance level lies between 0 and 1, such as 0.05")
    return alpha


def add_compare_arguments(add: Callable[..., Any], prefix: str = "--", runs: bool = True) -> None:
    """The comparison's options, for argparse (``lorabench compare``; ``lorabench ab``, which
    compares pairs, not runs, without ``runs``)."""
    add(f"{prefix}threshold", action="append", default=[], metavar="[METRIC=]PCT", help=THRESHOLD_HELP)
    add(f"{prefix}alpha", type=float, default=0.05, help=ALPHA_HELP)
    if runs:
        add(f"{prefix}noise-from", metavar="RUNS", help=NOISE_FROM_HELP)
    add(f"{prefix}format", choices=FORMATS, default="text", help="how the comparison is printed on stdout")
