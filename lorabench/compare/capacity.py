"""Capacity collapses in a comparison. Only a search that bracketed its SLO edge has a
capacity to test (``load.bracketed_only``); one that found no passing rate at all has no
figure, so a case whose capacity collapsed that far is named on its own, and fails the
comparison."""

from __future__ import annotations

from lorabench.capacity import BELOW_RANGE
from lorabench.compare.load import Run, case_of


def collapses(base: Run, new: Run) -> list[str]:
    """Cases whose base searches found a capacity and whose new ones all fell below the range."""
    found = []
    for side in (base, new):
        if "search_stop" not in side.all_rows or "_key" not in side.all_rows:
            return []
    base_stops = base.all_rows.groupby("_key")["search_stop"].agg(set)
    new_stops = new.all_rows.groupby("_key")["search_stop"].agg(set)
    for key in base_stops.index.intersection(new_stops.index):
        if new_stops[key] == {BELOW_RANGE} and base_stops[key] - {BELOW_RANGE}:
            label = ", ".join(f"{k}: {v}" for k, v in case_of(key).items() if v)
            found.append(f"CAPACITY COLLAPSED: {label}: every new search failed at its lowest rate ({BELOW_RANGE})")
    return found
