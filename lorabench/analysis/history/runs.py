"""Result files read as the runs the history stores: each row's case key, configuration,
build and compared metrics, read with the csv module (a nightly adds thousands of files;
pandas' per-file cost was most of it).

A case is keyed by the columns ``compare`` matches cases on (``MATCH_KEY``), each value
spelt one way: a number by its value (``8``, ``8.0`` and ``8.00`` are one case), anything
else as written, a blank as nothing.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import operator
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from lorabench.analysis.cases import CORE_METRICS, KEY_SEP, MATCH_KEY, METRICS, REQUIRED_KEY
from lorabench.results.records import digests_path_for
from lorabench.results.schema import ENGINE_KEY, OLDER_FILES, STACK_COLUMNS
from lorabench.results.search_stops import ABOVE_RANGE, BELOW_RANGE, BRACKETED


class HistoryError(Exception):
    """Input the history cannot take; the command line exits 2 with its one line."""


# Stored beside a build's capacity_rps where its search passed every rate up to its max_rate:
# that max_rate. Such a capacity is a bound (at least this), no measurement; the series keeps
# it as a point (a rise past the range is no regression, a measured fall from it is one), and
# this says which points are bounds (docs/history.md).
CAPPED_AT = "capacity_capped_at"

# What a stack is: the software and host a run measured, and lorabench's own commit.
STACK_ID_COLUMNS = (*STACK_COLUMNS, "git_commit")
# A fleet's rows may each have measured another stack: a Ray fleet's nodes have their own
# devices and drivers (its hostname is the session's on every row; ``NODE`` names the node,
# from ``fleet_devices``), a CPU fleet's slots their own cores (``device_count``). A run whose
# rows hold several is stored with the first row's stack as today, plus ``STACKS`` (the rows'
# distinct stacks, as JSON) and each row's own under ``ROW_STACK`` among its metrics (an index
# into them): the store's layout is unchanged, and a run of one stack is stored as before.
# ``series`` files each row under its own stack's machine (docs/history.md).
NODE, STACKS, ROW_STACK = "node", "row_stacks", "row_stack"
_BUILD = re.compile(r"-build\d+$")


@dataclass
class ReadRun:
    run_id: str
    source: Path
    stack: dict[str, str]
    timestamp: str = ""
    # (case key, configuration, build, {metric: value}) per row.
    rows: list[tuple[str, str, int, dict[str, float]]] = field(default_factory=list)
    # (model, device type, adapter) -> its greedy output digests, from the digests file beside.
    digests: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)
    # The config it ran with, flat (``compare.settings``); None: unknown.
    settings: dict[str, str] | None = None
    # The cases some build of which fell below its capacity search's range (a collapse).
    collapsed: set[str] = field(default_factory=set)
    # Its rows' distinct stacks, the first row's first, and each row's (an index into them).
    stacks: list[dict[str, str]] = field(default_factory=list)
    row_stacks: list[int] = field(default_factory=list)
    _stack_at: dict[tuple[str, ...], int] = field(default_factory=dict)

    def file_stacks(self) -> None:
        """Where its rows measured several stacks, keep each row's (``STACKS``, ``ROW_STACK``),
        so that no row is filed under the first row's node."""
        if len(self.stacks) < 2:
            return
        self.stack = {**self.stacks[0], STACKS: json.dumps(self.stacks, sort_keys=True)}
        for (_, _, _, metrics), at in zip(self.rows, self.row_stacks):
            metrics[ROW_STACK] = at

    def blank_collapsed(self) -> None:
        """No capacity point for a case where any build collapsed (fell below its search's
        range): the run's point is the median of its builds, and with the collapsed build
        left out the others' median read as if nothing happened (one build of two, or of
        three, gone). A blank the newest run has where earlier runs measured fails the gate
        that night (``NOT MEASURED``), as a collapse fails ``compare``."""
        for key, _, _, metrics in self.rows:
            if key in self.collapsed:
                metrics.pop("capacity_rps", None)


@functools.lru_cache(maxsize=1 << 16)  # a key's values repeat from run to run
def spelt(text: str | None) -> str:
    """One spelling per value: numbers by their value, anything else as written."""
    text = (text or "").strip()
    try:
        number = float(text)
    except ValueError:
        return text
    if math.isnan(number):
        return ""
    return str(int(number)) if number.is_integer() else repr(number)


@functools.lru_cache(maxsize=1 << 16)
def _spelt_key(values: tuple[str, ...], key: tuple[tuple[int | None, str], ...]) -> str:
    """``values`` (a row's key columns present in its file, in order) spelt as a case key,
    with the defaults of the columns the file lacks (``key``: each key column's index or None)."""
    given = iter(values)
    return KEY_SEP.join(spelt(next(given) if i is not None else older) for i, older in key)


class _Columns:
    """Where each column a run needs sits in a file's header (csv.reader's rows are lists:
    a dict of every column a row was most of the read)."""

    def __init__(self, header: list[str]) -> None:
        at = {name: i for i, name in enumerate(header)}
        self.width = len(header)
        self.key = tuple((at.get(c), OLDER_FILES.get(c, "")) for c in MATCH_KEY)
        # A whole row's key columns taken at once (in C), for rows as wide as the header.
        self.key_present = [i for i, _ in self.key if i is not None]
        self.key_values = operator.itemgetter(*self.key_present) if len(self.key_present) > 1 else None
        self.engine = [at.get(c) for c in ENGINE_KEY]
        self.metrics = [(m, at[m]) for m in METRICS if m in at]
        self.stack = [(c, at.get(c)) for c in STACK_ID_COLUMNS]
        self.engine_id, self.build = at.get("engine_id"), at.get("build")
        self.search_stop, self.capacity_max_rate = at.get("search_stop"), at.get("capacity_max_rate")
        self.run_id, self.timestamp = at["run_id"], at["timestamp"]
        self.target, self.fleet_devices = at.get("target"), at.get("fleet_devices")

    def stack_of(self, row: list[str]) -> dict[str, str]:
        """The row's stack. A ``serve`` target's endpoint is left out: lorabench started that
        server on a free port of this host, another each run, and no change of the stack."""
        stack = {c: self._get(row, i) or "unknown" for c, i in self.stack}
        if self._get(row, self.target) == "serve":
            stack["endpoint"] = "unknown"
        node = _node(self._get(row, self.fleet_devices))
        if node:
            stack[NODE] = node
        return stack

    def stack_index(self, run: ReadRun, row: list[str]) -> int:
        """Which of ``run``'s stacks the row measured, added where it is a new one."""
        values = (*(self._get(row, i) for _, i in self.stack), self._get(row, self.target))
        values = (*values, _node(self._get(row, self.fleet_devices)))
        at = run._stack_at.get(values)
        if at is None:
            at = run._stack_at[values] = len(run.stacks)
            run.stacks.append(self.stack_of(row))
        return at

    @staticmethod
    def _get(row: list[str], i: int | None, default: str = "") -> str:
        return row[i] if i is not None and i < len(row) else default

    def case_key(self, row: list[str]) -> str:
        """The row's case key; a row as wide as the header by its key columns' values at
        once, and a key spelt once per distinct set of values (they repeat run after run)."""
        if self.key_values is not None and len(row) >= self.width:
            return _spelt_key(self.key_values(row), self.key)
        return KEY_SEP.join(spelt(self._get(row, i, older)) for i, older in self.key)

    def record(self, run: ReadRun, row: list[str]) -> None:
        key = self.case_key(row)
        engine_id = self._get(row, self.engine_id)
        engine = _BUILD.sub("", engine_id) if engine_id else KEY_SEP.join(spelt(self._get(row, i)) for i in self.engine)
        metrics = {}
        for metric, i in self.metrics:
            try:
                value = float(row[i] or "nan")
            except (ValueError, IndexError):
                continue
            if math.isfinite(value):
                metrics[metric] = value
        stop = self._get(row, self.search_stop)
        if stop not in ("", BRACKETED, ABOVE_RANGE):
            # A search stopped by a limit or below its range found no capacity, or only a
            # bound under one (docs/capacity.md): not a point of the series, and the gate says
            # it is missing. A collapse blanks its case's other builds too (blank_collapsed).
            metrics.pop("capacity_rps", None)
            if stop == BELOW_RANGE:
                run.collapsed.add(key)
        elif stop == ABOVE_RANGE and "capacity_rps" in metrics:
            # One that passed the top of its range stands at that rate, marked as the bound it is.
            cap = self._get(row, self.capacity_max_rate)
            metrics[CAPPED_AT] = _number(cap, metrics["capacity_rps"])
        run.rows.append((key, engine, _build(self._get(row, self.build)), metrics))
        run.row_stacks.append(self.stack_index(run, row))
        run.timestamp = max(run.timestamp, _timestamp(row[self.timestamp]))


def _node(devices: str) -> str:
    """The node a Ray fleet's row ran on, from its ``fleet_devices`` (``host:1a2b3c4d npu 0``:
    ``host``); "" for any other row (a local fleet's slot, ``cpu 0-3``, is on the run's host)."""
    first = devices.split(" ", 1)[0]
    return first.split(":", 1)[0] if ":" in first else ""


def _number(text: str, default: float) -> float:
    """``text`` as a finite number, else ``default``."""
    try:
        value = float(text)
    except ValueError:
        return default
    return value if math.isfinite(value) else default


def parse_time(text: str) -> datetime:
    """A row's ISO time as lorabench writes it (``...Z``); ValueError where it is none."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _timestamp(text: str) -> str:
    """A row's time, which orders the series: a blank or unreadable one put a run first."""
    try:
        parse_time(text)
    except ValueError:
        raise HistoryError(
            f"column 'timestamp' has bad value {text!r}: the ISO time the row was written, such as "
            "2026-11-28T02:00:00+00:00 (as lorabench writes it)"
        ) from None
    return text


def _build(text: str) -> int:
    try:
        return int(float(text or 0))
    except ValueError:
        raise HistoryError(f"column 'build' has bad value {text!r}: a build number, 0 for the first") from None


def read_runs(path: Path) -> list[ReadRun]:
    """The runs a result file holds (a fixed output file holds several), oldest row first."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            missing = [c for c in (*REQUIRED_KEY, *CORE_METRICS, "timestamp", "run_id") if c not in header]
            if missing:
                raise HistoryError(f"{path}: not a lorabench result file: missing columns {', '.join(missing)}")
            columns = _Columns(header)
            runs: dict[str, ReadRun] = {}
            for row in reader:
                if len(row) < columns.width:
                    continue  # a row still being written: the run grows when it is added again
                run_id = columns._get(row, columns.run_id)
                if not run_id:
                    raise HistoryError(f"{path}: a row without a run_id: write it with lorabench 0.1 or later")
                if run_id not in runs:
                    runs[run_id] = ReadRun(run_id, path, columns.stack_of(row))
                columns.record(runs[run_id], row)
    except FileNotFoundError:
        raise HistoryError(f"{path}: no such file") from None
    except OSError as exc:
        raise HistoryError(f"{path}: cannot be read ({exc.strerror}): give a result CSV file") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise HistoryError(f"{path}: not a CSV file ({exc})") from None
    except HistoryError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise HistoryError(f"{path}: {exc}") from None
    if not runs:
        raise HistoryError(f"{path}: has no result rows")
    for run in runs.values():
        run.blank_collapsed()
        run.file_stacks()
    _read_digests(digests_path_for(path), runs)
    from lorabench.analysis.compare.settings import run_settings

    for run in runs.values():  # a file of several runs keeps its newest run's config only
        run.settings = run_settings(path, run.run_id, named_only=len(runs) > 1)
    return list(runs.values())


def _read_digests(path: Path, runs: dict[str, ReadRun]) -> None:
    """Each run's adapters' output digests, where the digests file beside has them."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                run = runs.get(row.get("run_id") or "")
                if run is not None and row.get("digest"):
                    key = (row.get("model") or "", row.get("device_type") or "", row.get("adapter") or "")
                    run.digests.setdefault(key, set()).add(row["digest"])
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise HistoryError(f"{path}: not a CSV file ({exc})") from None
