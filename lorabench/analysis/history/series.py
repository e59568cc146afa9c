"""A case's metric over the stored runs, in order, with its change points.

The order is the runs' time by default. Nightlies built out of order are put in order by
an order file: one stack id a line (``lorabench history show`` prints each run's), oldest
first; a run whose stack the file does not list is refused, not guessed at.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lorabench.analysis.cases import MATCH_KEY, case_label, case_of
from lorabench.analysis.history.changes import Change, change_points
from lorabench.analysis.history.runs import CAPPED_AT, ROW_STACK, STACKS, HistoryError
from lorabench.analysis.history.store import StoredRun, case_keys, case_rows, stack_id, stored_runs


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
    """The stored runs in the series' order (by time, or by ``order_file``'s stack ids), each
    as one run per machine its rows measured on (``parts``): a Ray fleet's run is one run of
    each kind of node, so each machine's newest run is judged on that machine's rows."""
    runs = stored_runs(conn)
    if order_file is not None:
        runs = _in_order(runs, order_file)
    return [part for run in runs for part in parts(run)]


def _in_order(runs: list[StoredRun], order_file: Path) -> list[StoredRun]:
    """``runs`` in the order of ``order_file``'s stack ids: a run's own (as ``history add``
    prints it), or any of its rows' (as ``history show`` prints a run of several)."""
    try:
        order = [line.split()[0] for line in order_file.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise HistoryError(f"--order {order_file}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise HistoryError(f"--order {order_file}: not a text file of stack ids, one a line") from None
    position = {stack: i for i, stack in enumerate(order)}

    placed = {}
    for run in runs:
        ids = [run.stack_id, *(stack_id(s) for s in row_stacks(run))]
        placed[run.run_id] = min((position[i] for i in ids if i in position), default=None)
    unknown = sorted({r.stack_id for r in runs if placed[r.run_id] is None})
    if unknown:
        raise HistoryError(f"--order {order_file}: does not list stack {unknown[0]}: add a line for it")
    return sorted(runs, key=lambda r: (placed[r.run_id], r.timestamp))


def row_stacks(run: StoredRun) -> list[dict[str, str]]:
    """The stacks a run's rows measured (``runs.STACKS``); a run of one: its own."""
    return json.loads(run.stack[STACKS]) if STACKS in run.stack else [run.stack]


def part(run: StoredRun, stacks: Sequence[dict[str, str]]) -> StoredRun:
    """``run`` as the rows that measured ``stacks`` (of one machine) see it: a column they
    differ on is their values, joined (``driver_version 1.0, 2.0``), as ``compare`` says it."""
    joined: dict[str, str] = {}
    for column in dict.fromkeys(c for stack in stacks for c in stack):
        joined[column] = ", ".join(sorted({stack.get(column, "unknown") for stack in stacks}))
    return StoredRun(run.run_id, run.timestamp, stack_id(joined), joined, run.settings)


def parts(run: StoredRun) -> list[StoredRun]:
    """``run`` once per machine its rows measured on (itself, for a run of one stack)."""
    if STACKS not in run.stack:
        return [run]
    by_machine: dict[str, list[dict[str, str]]] = {}
    for stack in row_stacks(run):
        by_machine.setdefault(machine_of(stack), []).append(stack)
    return [part(run, stacks) for stacks in by_machine.values()]


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
    """The host a run measured on: runs of two machines are two series, never one (a run of
    several, a fleet's: ``parts``)."""
    return machine_of(run.stack)


def machine_of(stack: dict[str, str]) -> str:
    """A stack's machine: its host, device and count. A server measured through its URL (a
    ``url`` target) is named by that URL too: two servers measured from one client host are
    two machines."""
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
    (a case measured on two hosts is labelled with each). Each row is filed under its own
    stack's machine, and each point's run carries the stack of the case's rows in it: a case
    whose builds moved to another node is a change of stack at that run (``node a -> b``)."""
    place, stacks = _places(conn, runs)
    found = []
    for key, label in labels(case_keys(conn)).items():
        if not select(label):
            continue
        by_machine: dict[str, dict[int, list[tuple[int, dict[str, float]]]]] = {}
        for run_id, _, measured in case_rows(conn, key):
            if run_id in place:
                at = int(measured.get(ROW_STACK, 0))
                host = machine_of(stacks[run_id][at])
                by_machine.setdefault(host, {}).setdefault(place[run_id], []).append((at, measured))
        for host, rows in sorted(by_machine.items()):
            name = f"{label} on {host}" if len(by_machine) > 1 else label
            seen = {at: _seen(runs[at], stacks[runs[at].run_id], {i for i, _ in r}) for at, r in rows.items()}
            flat = [(at, measured) for at, r in rows.items() for _, measured in r]
            scenario = case_of(key)["scenario"]
            found += [s for m in metrics if (s := _one(name, m, flat, seen, scenario)) is not None]
    return found


def _places(conn: sqlite3.Connection, runs: Sequence[StoredRun]) -> tuple[dict[str, int], dict[str, list]]:
    """Each run's place in ``runs`` (its first part's), and its rows' stacks, as stored."""
    place: dict[str, int] = {}
    for i, run in enumerate(runs):
        place.setdefault(run.run_id, i)
    return place, {r.run_id: row_stacks(r) for r in stored_runs(conn) if r.run_id in place}


def _seen(given: StoredRun, stacks: list[dict[str, str]], indices: set[int]) -> StoredRun:
    """The run as a case's rows in it see it: ``given`` where the run measured one stack, else
    the stacks of those rows (``part``)."""
    return given if len(stacks) == 1 else part(given, [stacks[i] for i in sorted(indices)])


def _one(
    name: str, metric: str, rows: list[tuple[int, dict[str, float]]], seen: dict[int, StoredRun], scenario: str
) -> Series | None:
    by_run: dict[int, list[float]] = {}
    measured_builds: set[int] = set()  # runs with a build that measured, not only a bound
    for at, measured in rows:
        if metric in measured:
            by_run.setdefault(at, []).append(measured[metric])
            if not (metric == "capacity_rps" and CAPPED_AT in measured):
                measured_builds.add(at)
    if not by_run:
        return None
    order = sorted(by_run)
    builds = [np.array(by_run[at]) for at in order]
    # A run is a bound where every build was capped: one build that measured makes it a
    # measurement (a fall it shows is a fall, whatever the others' cap).
    bounds = tuple(at not in measured_builds for at in order) if set(order) - measured_builds else ()
    points = change_points(run_medians(builds))
    return Series(name, metric, [seen[at] for at in order], builds, points, scenario, bounds)
