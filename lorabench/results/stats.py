"""Summaries of per-request samples: the mean and percentiles every metric column carries."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from lorabench.results.columns import PERCENTILES


def percentile(values: Iterable[float], p: float) -> float:
    """numpy's linear percentile of the values that are not NaN; NaN when none are."""
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    return float(np.percentile(arr, p)) if arr.size else math.nan


def summary(name: str, values: Iterable[float]) -> dict[str, float]:
    """``{name: mean, name_p50: ..., name_p90: ..., name_p99: ...}`` over the values that are not NaN."""
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if not arr.size:
        return {name: math.nan, **{f"{name}_p{p}": math.nan for p in PERCENTILES}}
    return {
        name: float(arr.mean()),
        **{f"{name}_p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES))},
    }
