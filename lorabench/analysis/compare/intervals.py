"""Each side's own interval beside its figure in a comparison's lines and the report's tables
(the definitions: docs/metrics.md#intervals, docs/capacity.md#rows-probes-and-samples).

A batch row carries its headline metrics' 95 % half-width over its build's rounds
(``<metric>_ci_pct``); a capacity row its SLO edge's interval (``capacity_ci_low_rps``,
``capacity_ci_high_rps``). A side's figure is the mean over its builds (and pooled runs, or
A/B pairs), each with an interval of its own; the side shows the widest: the largest
half-width, the hull of the edges. Why the widest:

- a mean of figures, each within a factor 1 + w_i of its own centre, is within 1 + max w_i of
  theirs: the widest never claims a precision that some build lacked;
- the builds' spread, the other candidate, is what the verdict tests against, and the header
  states it already (the noise, the smallest change flagged); on every line it would repeat
  one pooled figure per metric rather than each side's own, and it would appear for files
  that recorded no interval.

Where a build that measured the metric has no interval (a file from before the columns, a
single round), the side shows nothing: the widest of the others could be too narrow. Display
only: no verdict reads these.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lorabench.analysis.cases import KEY_SEP, MATCH_KEY
from lorabench.analysis.compare.load import Run

CI_PCT = {metric: f"{metric}_ci_pct" for metric in ("e2e_ms", "ttft_ms", "decode_ms")}
EDGE = ("capacity_ci_low_rps", "capacity_ci_high_rps")
CAPACITY = "capacity_rps"


def widest_pct(rows: pd.DataFrame, metric: str) -> float | None:
    """The largest half-width, %, over the rows that measured ``metric``; None where the
    metric has no interval column, or some such row lacks its interval."""
    column = CI_PCT.get(metric)
    if column not in rows or metric not in rows:
        return None
    measured = pd.to_numeric(rows[metric], errors="coerce") > 0
    pct = pd.to_numeric(rows.loc[measured, column], errors="coerce")
    if pct.empty or not np.isfinite(pct.to_numpy(dtype=float)).all():
        return None
    return float(pct.max())


def edge_hull(rows: pd.DataFrame) -> tuple[float, float] | None:
    """The hull of the rows' SLO edge intervals: a blank end is open (0 below, inf above, as
    the search leaves a side no probe bounds). None where a row has neither end, or nothing
    is bounded on either side."""
    if any(c not in rows for c in EDGE) or rows.empty:
        return None
    low, high = (pd.to_numeric(rows[c], errors="coerce") for c in EDGE)
    if (low.isna() & high.isna()).any():
        return None
    hull = float(low.fillna(0.0).min()), float(high.fillna(math.inf).max())
    return None if hull[0] <= 0 and math.isinf(hull[1]) else hull


def pct_text(pct: float | None) -> str:
    """``±3.1%``, or "" where there is no interval."""
    return "" if pct is None else f"±{pct:.1f}%"


def edge_text(hull: tuple[float, float] | None) -> str:
    """``[9.8, 10.6]``; an open end as ``(0`` or ``inf)``; "" where there is no interval."""
    if hull is None:
        return ""
    low, high = hull
    left = "(0" if low <= 0 else f"[{low:.3g}"
    right = "inf)" if math.isinf(high) else f"{high:.3g}]"
    return f"{left}, {right}"


def interval_text(rows: pd.DataFrame | None, metric: str) -> str:
    """One side's interval of ``metric`` over ``rows`` (one case's builds), as a line shows it."""
    if rows is None:
        return ""
    return edge_text(edge_hull(rows)) if metric == CAPACITY else pct_text(widest_pct(rows, metric))


class SideIntervals:
    """Both sides' intervals for one comparison's lines, each side's rows grouped by case
    once (only the columns the intervals read)."""

    def __init__(self, base: Run, new: Run) -> None:
        self._sides = [_by_case(run.all_rows) for run in (base, new)]

    def texts(self, case: dict[str, str], metric: str) -> tuple[str, str]:
        """Base's and new's interval of ``metric`` in ``case`` (``Finding.case``), "" where none."""
        key = KEY_SEP.join(case[c] for c in MATCH_KEY)
        base, new = (interval_text(side.get(key), metric) for side in self._sides)
        return base, new


def _by_case(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    read = [c for c in (*CI_PCT, *CI_PCT.values(), *EDGE) if c in rows]
    return dict(tuple(rows[["_key", *read]].groupby("_key", sort=False)))
