"""Each side's own interval beside its figure in a comparison's lines and the report's tables
(the definitions: docs/metrics.md#intervals, docs/capacity.md#rows-probes-and-samples).

Which interval. A side's figure is a mean over its builds, and builds, not rounds, are the
replicates that differ (a build's rounds interval says nothing of the next build). So a side
with 2 or more builds shows the 95 % t interval of the mean of its builds' log values (df =
builds - 1), exp(m) / (1 + w) .. exp(m) · (1 + w): docs/metrics.md#intervals's construction
applied to one value a build. Pooled runs (and A/B pairs) count each run's mean as one draw,
as the test does: drift between runs is noise too. A side of one build shows that build's
rounds interval (``<metric>_ci_pct``), around the row's figure: the row keeps the rounds'
arithmetic mean, not the geometric mean the interval is centred on, which it exceeds by about
half the rounds' variance of log, small beside w. A capacity shows the hull of its builds'
SLO edge intervals (``capacity_ci_low_rps``, ``capacity_ci_high_rps``).

How it is printed: its two ends, ``[34.40, 348.85]`` (builds at 100 and 120 ms), never
``±w%`` nor a factor (``×÷``):

- the interval is not symmetric: ``±88%`` reads as a low end of 0.12× where it is 1/1.88;
- the figure beside it is the arithmetic mean over builds, the interval is centred on their
  geometric mean: any form relative to a centre would be read around the printed figure;
- the capacity's SLO edge, in the same column, is printed as its ends already.

Nothing is shown where there is no interval: a file from before the interval columns (as
before them: its table unchanged), one build without its rounds interval (one round), a
capacity row with neither edge. Display only: no verdict reads these.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lorabench.analysis.cases import KEY_SEP, MATCH_KEY
from lorabench.analysis.compare.load import Run
from lorabench.analysis.compare.noise import t_ppf

CI_PCT = {metric: f"{metric}_ci_pct" for metric in ("e2e_ms", "ttft_ms", "decode_ms")}
EDGE = ("capacity_ci_low_rps", "capacity_ci_high_rps")
CAPACITY = "capacity_rps"
LEVEL = 0.95


def over_draws(logs: np.ndarray) -> tuple[float, float] | None:
    """The 95 % t interval of the geometric mean of the draws whose logs are ``logs``: exp of
    their mean ∓ t · sd / √n; None under 2 draws."""
    n = len(logs)
    if n < 2:
        return None
    centre, spread = float(logs.mean()), t_ppf(0.5 + LEVEL / 2, n - 1) * float(logs.std(ddof=1)) / math.sqrt(n)
    return math.exp(centre - spread), math.exp(centre + spread)


def side_interval(rows: pd.DataFrame, metric: str) -> tuple[float, float] | None:
    """One side's interval of ``metric`` over ``rows`` (one case's builds, of one run or
    several, ``_run``): over its draws (builds, or runs' means) where it has 2 or more, else
    the one build's rounds interval around its figure. None where the metric has no interval
    column, the side's rows lack it (an older file), or the one build has no interval."""
    column = CI_PCT.get(metric)
    if column is None or column not in rows or metric not in rows:
        return None
    values = pd.to_numeric(rows[metric], errors="coerce")
    measured = (values > 0).to_numpy()
    if not measured.any():
        return None
    logs = pd.Series(np.log(values.to_numpy(dtype=float)[measured]))
    runs = rows["_run"].to_numpy()[measured] if "_run" in rows else np.zeros(len(logs))
    if len(set(runs)) > 1:  # several runs: each run's mean is one draw
        logs = logs.groupby(runs).mean()
    if len(logs) >= 2:
        return over_draws(logs.to_numpy())
    figure = float(values.to_numpy(dtype=float)[measured][0])
    pct = float(pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)[measured][0])
    return (figure / (1 + pct / 100), figure * (1 + pct / 100)) if math.isfinite(pct) else None


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


def ends_text(interval: tuple[float, float] | None) -> str:
    """``[95.12, 127.04]``, as the figures are printed; "" where there is no interval."""
    return "" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


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
    return edge_text(edge_hull(rows)) if metric == CAPACITY else ends_text(side_interval(rows, metric))


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
    read = [c for c in ("_run", *CI_PCT, *CI_PCT.values(), *EDGE) if c in rows]
    return dict(tuple(rows[["_key", *read]].groupby("_key", sort=False)))
