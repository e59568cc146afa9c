"""A case's metric over the stored runs, in order, with its change points.

The order is the runs' time by default. Nightlies built out of order are put in order by
an order file: one stack id a line (``lorabench history show`` prints each run's), oldest
first; a run whose stack the file does not list is refused, not guessed at.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lorabench.analysis.compare.load import case_of
from lorabench.analysis.compare.render import case_label
from lorabench.analysis.history.changes import Change, change_points
from lorabench.analysis.history.store import HistoryError, StoredRun, case_rows, stored_runs


@dataclass(frozen=True)
class Series:
    case: str  # the case's label, as compare names it
    metric: str
    runs: list[StoredRun]  # the runs that measured it, in order
    builds: list[np.ndarray]  # each run's builds: replicates of one point
    changes: list[Change]

    @property
    def medians(self) -> np.ndarray:
        return np.array([np.median(b) for b in self.builds])


def ordered_runs(conn: sqlite3.Connection, order_file: Path | None = None) -> list[StoredRun]:
    """The stored runs in the series' order: by time, or by ``order_file``'s stack ids."""
    runs = stored_runs(conn)
    if order_file is None:
        return runs
    try:
        order = [line.split()[0] for line in order_file.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise HistoryError(f"--order {order_file}: cannot be read ({exc.strerror})") from None
    position = {stack: i for i, stack in enumerate(order)}
    unknown = sorted({r.stack_id for r in runs} - set(position))
    if unknown:
        raise HistoryError(f"--order {order_file}: does not list stack {unknown[0]}: add a line for it")
    return sorted(runs, key=lambda r: (position[r.stack_id], r.timestamp))


def series(
    conn: sqlite3.Connection,
    runs: Sequence[StoredRun],
    metrics: Sequence[str],
    select: Callable[[str], bool] = lambda label: True,
) -> list[Series]:
    """Each selected case's series for each of ``metrics`` it has values of."""
    rows = case_rows(conn)
    place = {r.run_id: i for i, r in enumerate(runs)}
    found = []
    for key, case in rows.groupby("case_key", sort=True):
        label = case_label(case_of(key))
        if not select(label):
            continue
        for metric in metrics:
            measured = case[case[metric].notna() & case["run_id"].isin(place)]
            if measured.empty:
                continue
            by_run = sorted(measured.groupby("run_id")[metric], key=lambda g: place[g[0]])
            builds = [values.to_numpy(dtype=float) for _, values in by_run]
            medians = np.array([np.median(b) for b in builds])
            found.append(Series(label, metric, [runs[place[r]] for r, _ in by_run], builds, change_points(medians)))
    return found
