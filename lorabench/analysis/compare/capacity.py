"""Capacities in a comparison that are bounds, not measurements (docs/compare.md, "Capacity
bounds"). A search that bracketed its SLO edge has a capacity the t-test judges like any
metric; one that stopped otherwise knows only an interval: at least what it passed (above
``max_rate``, or a limit with only passes), below what it failed (below ``min_rate``, or a
limit with only fails), or the bracket a limit left. A case where any search of either
side did not bracket (``load.bracketed_only`` keeps it from the t-test) is judged here on
those intervals. A case where some new build fell below the range and no base build did (or
every new build and not every base build) is named on its own (a collapse), and fails the
comparison: one build of two that serves nothing within its SLOs is no interval's low end,
and the other's bracket would hide it. A search capped at ``max_rate`` is a bound, at least
that: under what the other side passed it is not comparable, and the line says to raise
``capacity.max_rate``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from lorabench.analysis.cases import case_of
from lorabench.analysis.compare.load import PASSED, Run
from lorabench.results.search_stops import ABOVE_RANGE, BELOW_RANGE, BRACKETED, NO_VERDICT


@dataclass(frozen=True)
class Interval:
    """Where one side's capacity lies over all its builds: from the lowest rate a build
    passed (0 where one passed none) up to the highest rate a build failed (inf where one
    failed none); and why its searches stopped where they did not bracket."""

    low: float
    high: float
    stops: tuple[str, ...]  # each search that did not bracket: "stopped at max_rate 8", ...
    # The highest max_rate a build passed all the way up to (above max_rate): a bound, at least
    # that, whatever lies above; nan where no build was capped.
    capped: float = math.nan

    def __str__(self) -> str:
        if self.low > 0 and math.isinf(self.high):
            return f"at least {self.low:.3g} req/s"
        if self.low == 0 and math.isfinite(self.high):
            return f"below {self.high:.3g} req/s"
        if self.low == 0:
            return "unknown (no probe decided)"
        return f"between {self.low:.3g} and {self.high:.3g} req/s"


@dataclass(frozen=True)
class CapacityBound:
    """One case's capacity judged on its intervals: -1 regressed, +1 improved, 0 not shown."""

    case: dict[str, str]
    base: Interval
    new: Interval
    change: int
    why: str


def _stopped(stop: str, row: pd.Series) -> str:
    if stop == ABOVE_RANGE and pd.notna(row.get("capacity_max_rate")):
        return f"stopped at max_rate {float(row['capacity_max_rate']):g}"
    if stop == BELOW_RANGE:
        return f"fell below min_rate ({float(row['capacity_over_rps']):g} req/s failed)"
    return f"stopped at {stop}"


def interval(rows: pd.DataFrame) -> Interval:
    """The interval a side's builds of one case leave its capacity in."""
    lows = rows[PASSED].astype(float).fillna(0.0)
    highs = rows["capacity_over_rps"].astype(float).fillna(math.inf)
    stops = (_stopped(str(row["search_stop"]), row) for _, row in rows.iterrows() if row["search_stop"] != BRACKETED)
    capped = rows[rows["search_stop"] == ABOVE_RANGE]
    caps = capped.get("capacity_max_rate", capped[PASSED]).astype(float).fillna(capped[PASSED].astype(float))
    top = float(caps.max()) if len(caps) else math.nan
    return Interval(float(lows.min()), float(highs.max()), tuple(dict.fromkeys(stops)), top)


def _not_comparable(base: Interval, new: Interval) -> str | None:
    """Where a side's searches were capped (``max_rate``) under what the other side passed: a
    capped capacity is a bound, at least the cap, and a bound under a value says nothing of
    which is higher (a lowered ``capacity.max_rate`` is no 60 % fall). None where neither was."""
    for side, mine, other_side, other in (("new", new, "base", base), ("base", base, "new", new)):
        if mine.capped < other.low:  # nan (not capped) is never under
            past = other.high if math.isfinite(other.high) else other.low
            return (
                f"not comparable: the {side} search was capped at max_rate {mine.capped:g} (a bound: at least "
                f"{mine.capped:g} req/s), under the {other.low:g} req/s the {other_side} passed; raise "
                f"capacity.max_rate past {past:g} on the {side} side"
            )
    return None


def judge_bounds(base: Interval, new: Interval, threshold: float) -> tuple[int, str]:
    """A regression only when the new interval lies wholly below the base one, and even its
    smallest possible fall, measured from the base as the t-test measures a change
    ((base low - new high) / base low), passes the threshold; an improvement likewise
    ((new low - base high) / base high). Anything else is not shown, and says why."""
    if new.high <= base.low * (1 - threshold):
        return -1, f"at least {1 - new.high / base.low:.0%} lower"
    if base.high * (1 + threshold) <= new.low:
        return 1, f"at least {new.low / base.high - 1:.0%} higher"
    capped = _not_comparable(base, new)
    if capped:
        return 0, capped
    if new.low < base.high and base.low < new.high:
        stopped = "; ".join(f"{side} search {s}" for side, i in (("new", new), ("base", base)) for s in i.stops)
        return 0, f"cannot tell: {stopped}; the bounds overlap"
    return 0, f"not shown: apart by less than the threshold ({threshold:.0%})"


def collapse(base: pd.DataFrame, new: pd.DataFrame) -> str | None:
    """How many of the new side's builds of a case fell below their search's range (failed
    even at the lowest rate a probe can judge), where that is a collapse: some did and no base
    build did, or all did and not all of the base's. One build of two that collapses is a
    capacity gone on that build, not a wider interval: judged on bounds, the other build's
    bracket would pass it. Where both sides have some, the base was as broken, and the case is
    judged on its bounds. None where it is no collapse."""
    fell = [int((rows["search_stop"] == BELOW_RANGE).sum()) for rows in (base, new)]
    builds = [len(base), len(new)]
    if not fell[1] or (fell[0] and (fell[1] < builds[1] or fell[0] == builds[0])):
        return None
    rates = new.loc[new["search_stop"] == BELOW_RANGE, "capacity_over_rps"].astype(float).dropna()
    at = f" ({rates.min():g} req/s failed)" if len(rates) else ""
    base_said = f"{fell[0]} of the base's {builds[0]}" if fell[0] else f"none of the base's {builds[0]}"
    return f"{fell[1]} of {builds[1]} new builds fell below min_rate{at}, {base_said}"


def _sides(base: Run, new: Run) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    for side in (base, new):
        if any(c not in side.all_rows for c in ("search_stop", "_key", PASSED, "capacity_over_rps")):
            return None
    return tuple(s.all_rows[s.all_rows["search_stop"].notna()] for s in (base, new))  # type: ignore[return-value]


def capacity_verdicts(base: Run, new: Run, threshold: float) -> tuple[list[str], list[str], list[CapacityBound]]:
    """The cases whose capacity collapsed (on some new build: ``collapse``), those whose new
    searches stopped with no verdict (a server that failed requests, a client that fell behind:
    nothing to judge, and a run to look at), and those judged on bounds (every other shared
    case where a search of either side did not bracket: each case is named once)."""
    sides = _sides(base, new)
    if sides is None:
        return [], [], []
    groups = [dict(tuple(rows.groupby("_key"))) for rows in sides]
    collapsed, unjudged, bounds = [], [], []
    for key in sorted(groups[0].keys() & groups[1].keys()):
        stops = [set(g[key]["search_stop"]) for g in groups]
        label = ", ".join(f"{k}: {v}" for k, v in case_of(key).items() if v)
        no_verdict = sorted(s for s in stops[1] if str(s).startswith(NO_VERDICT))
        fell = collapse(groups[0][key], groups[1][key])
        if no_verdict:
            unjudged.append(f"CAPACITY NOT FOUND: {label}: a new search stopped with no verdict ({no_verdict[0]})")
        elif fell:
            collapsed.append(f"CAPACITY COLLAPSED: {label}: {fell}")
        elif stops[0] | stops[1] != {BRACKETED}:
            sides_at = interval(groups[0][key]), interval(groups[1][key])
            bounds.append(CapacityBound(case_of(key), *sides_at, *judge_bounds(*sides_at, threshold)))
    return collapsed, unjudged, bounds
