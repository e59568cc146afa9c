"""The comparison's options, declared once: ``lorabench compare`` and ``lorabench ab`` add them
to argparse, and the pytest plugin adds them prefixed (``--bench-compare-threshold``), so the
two can never drift apart."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from lorabench.analysis.cases import METRICS
from lorabench.analysis.compare import CompareError

DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.05
FORMATS = ("text", "markdown", "csv", "json")  # the renderers lorabench.analysis.show prints with
THRESHOLD_HELP = f"smallest change that counts, default {DEFAULT_THRESHOLD:.0%}%; repeat per metric, e.g. decode_ms=5%%"
ALPHA_HELP = (
    f"significance level after adjustment: the chance that two same-code runs flag anything (default {DEFAULT_ALPHA})"
)
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


def parse_thresholds(values: Sequence[str], default: float = DEFAULT_THRESHOLD) -> tuple[float, dict[str, float]]:
    """``["5%", "decode_ms=2%"]`` -> (0.05, {"decode_ms": 0.02}); a bare number is a percentage."""
    per_metric: dict[str, float] = {}
    for value in values:
        metric, _, amount = value.rpartition("=")
        try:
            fraction = float(amount.strip().rstrip("%")) / 100.0
        except ValueError:
            raise CompareError(f"--threshold {value!r}: expected a percentage such as 10% or decode_ms=5%") from None
        if not 0 <= fraction < math.inf:  # nan too: a threshold of nan would switch the gate off
            raise CompareError(f"--threshold {value!r}: must be a percentage of 0 or more, such as 5%")
        if not metric:
            default = fraction
        elif metric in METRICS:
            per_metric[metric] = fraction
        else:
            raise CompareError(f"--threshold {value!r}: unknown metric {metric!r}; metrics are {', '.join(METRICS)}")
    return default, per_metric


def add_compare_arguments(add: Callable[..., Any], prefix: str = "--", runs: bool = True) -> None:
    """The comparison's options, for argparse (``lorabench compare``; ``lorabench ab``, which
    compares pairs, not runs, without ``runs``)."""
    add(f"{prefix}threshold", action="append", default=[], metavar="[METRIC=]PCT", help=THRESHOLD_HELP)
    add(f"{prefix}alpha", type=float, default=DEFAULT_ALPHA, help=ALPHA_HELP)
    if runs:
        add(f"{prefix}noise-from", metavar="RUNS", help=NOISE_FROM_HELP)
    add(f"{prefix}format", choices=FORMATS, default="text", help="how the comparison is printed on stdout")
