"""A case's metric over the stored runs, in order, with its change points.

The order is the runs' time by default. Nightlies built out of order are put in order by
an order file: one stack id a line (``lorabench history show`` prints each run's), oldest
first; a run whose stack the file does not list is refused, not guessed at.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lorabench.analysis.cases import MATCH_KEY, case_label, case_of
from lorabench.analysis.history.changes import Change, change_points
from lorabench.analysis.history.runs import CAPPED_AT, HistoryError
from lorabench.analysis.history.store import StoredRun, case_keys, case_rows, stored_runs


@dataclass(frozen=True, eq=False)  # eq: its arrays have no single truth value
class Series:
    case: str  # the case's label, as compare names it
    metric: str
    runs: list[StoredRun]  # the runs that measured it, in order
    builds: list[np.ndarray]  # each run's builds: replicates of one point
    changes: list[Change]
    scenario: str = ""  # the case's, whose settings can move it (compare.settings.for_case)
    # Per run: its point is a bound, not a measurement (a capacity search that passed every
    # rate up to its max_rate: at least that); empty where no run's is.
    bounds: tuple[bool, ...] = ()

    @functools.cached_property
    def medians(self) -> np.ndarray:
        """Each run's median over its builds (a run of one build: its value)."""
        return run_medians(self.builds)


def run_medians(builds: Sequence[np.ndarray]) -> np.ndarray:
    """Each run's median over its builds; computed per run only where a run has several (a
    nightly of 10,000 one-build runs: np.median's own overhead was most of a show)."""
    return np.array([b[0] if len(b) == 1 else np.median(b) for b in builds], dtype=float)


def ordered_runs(conn: sqlite3.Connection, order_file: Path | None = None) -> list[StoredRun]:
    """The stored runs in the series' order: by time, or by ``order_file``'s stack ids."""
    runs = stored_runs(conn)
    if order_file is None:
        return runs
    try:
        order = [line.split()[0] for line in order_file.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise HistoryError(f"--order {order_file}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise HistoryError(f"--order {order_file}: not a text file of stack ids, one a line") from None
    position = {stack: i for i, stack in enumerate(order)}
    unknown = sorted({r.stack_id for r in runs} - set(position))
    if unknown:
        raise HistoryError(f"--order {order_file}: does not list stack {unknown[0]}: add a line for it")
    return sorted(runs, key=lambda r: (position[r.stack_id], r.timestamp))


def labels(keys: Sequence[str]) -> dict[str, str]:
    """Each case's name as compare gives it, with the key columns that tell apart cases the
    name alone would not (two models, two targets, two SLOs): ``... [model=a]``."""
    named: dict[str, list[str]] = {}
    for key in keys:
        named.setdefault(case_label(case_of(key)), []).append(key)
    out = {}
    for label, group in named.items():
        cases = [case_of(k) for k in group]
        apart = [c for c in MATCH_KEY if len({case[c] for case in cases}) > 1]
        for key, case in zip(group, cases):
            out[key] = f"{label} [{', '.join(f'{c}={case[c]}' for c in apart)}]" if apart else label
    return out


def machine(run: StoredRun) -> str:
    """The host a run measured on: runs of two machines are two series, never one. A server
    measured through its URL (a ``url`` target) is named by that URL too: two servers
    measured from one client host are two machines."""
    stack = run.stack
    device = f"{stack.get('device_name', 'unknown')} x{stack.get('device_count', '?')}"
    host = f"{stack.get('hostname', 'unknown')} ({device})"
    endpoint = stack.get("endpoint", "unknown")
    return host if endpoint in ("", "unknown") else f"{host} via {endpoint}"


def settings_changed(before: StoredRun, after: StoredRun, scenario: str) -> list[str] | None:
    """The settings two runs ran with apart that can move a case of ``scenario``; None where
    either run's are unknown."""
    if before.settings is None or after.settings is None:
        return None
    if before.settings == after.settings:  # most nights: no need to scope them (the page asks per pair of runs)
        return []
    from lorabench.analysis.compare.settings import changed_settings, for_case  # its imports: only when asked

    return changed_settings(for_case(before.settings, scenario), for_case(after.settings, scenario))


def series(
    conn: sqlite3.Connection,
    runs: Sequence[StoredRun],
    metrics: Sequence[str],
    select: Callable[[str], bool] = lambda label: True,
) -> list[Series]:
    """Each selected case's series for each of ``metrics`` it has values of, one per machine
    (a case measured on two hosts is labelled with each)."""
    place = {r.run_id: i for i, r in enumerate(runs)}
    found = []
    for key, label in labels(case_keys(conn)).items():
        if not select(label):
            continue
        by_machine: dict[str, list[tuple[int, dict[str, float]]]] = {}
        for run_id, _, measured in case_rows(conn, key):
            if run_id in place:
                by_machine.setdefault(machine(runs[place[run_id]]), []).append((place[run_id], measured))
        for host, rows in sorted(by_machine.items()):
            name = f"{label} on {host}" if len(by_machine) > 1 else label
            scenario = case_of(key)["scenario"]
            found += [s for m in metrics if (s := _one(name, m, rows, runs, scenario)) is not None]
    return found


def _one(
    name: str, metric: str, rows: list[tuple[int, dict[str, float]]], runs: Sequence[StoredRun], scenario: str
) -> Series | None:
    by_run: dict[int, list[float]] = {}
    capped: set[int] = set()
    for at, measured in rows:
        if metric in measured:
            by_run.setdefault(at, []).append(measured[metric])
            if metric == "capacity_rps" and CAPPED_AT in measured:
                capped.add(at)
    if not by_run:
        return None
    order = sorted(by_run)
    builds = [np.array(by_run[at]) for at in order]
    bounds = tuple(at in capped for at in order) if capped else ()
    points = change_points(run_medians(builds))
    return Series(name, metric, [runs[at] for at in order], builds, points, scenario, bounds)
