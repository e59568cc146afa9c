"""The results store: every run added to one SQLite file, keyed by its run id and its stack.

SQLite, not DuckDB: it ships with Python, so the store shares vLLM's environment with no
wheel to pin, and a file that several workers append to at once is what it is built for
(one writer at a time, the others wait on its lock; ``BUSY_TIMEOUT_S``). The history reads
one case at a time, which an index serves; nothing here needs a column store. CSV stays the
interchange: a run is added from its result file, and nothing is kept that the file does
not say.

A run is added whole, in one transaction, or not at all; adding a run the store holds
already (the same ``run_id``) changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lorabench.analysis.compare.load import CORE_METRICS, METRICS, REQUIRED_KEY, CompareError, keyed, read_result_csv
from lorabench.results.schema import STACK_COLUMNS

# How long a writer waits for another's transaction to end before it gives up.
BUSY_TIMEOUT_S = 120.0
# What a stack is: the software and host a run measured, and lorabench's own commit.
STACK_ID_COLUMNS = (*STACK_COLUMNS, "git_commit")

_TABLES = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    timestamp TEXT NOT NULL,
    stack_id TEXT NOT NULL,
    stack TEXT NOT NULL,
    source TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rows (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    case_key TEXT NOT NULL,
    engine TEXT NOT NULL,
    build INTEGER NOT NULL,
    metrics TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rows_by_case ON rows(case_key);
"""


class HistoryError(Exception):
    """Input the history cannot take; the command line exits 2 with its one line."""


@dataclass(frozen=True)
class StoredRun:
    run_id: str
    timestamp: str
    stack_id: str
    stack: dict[str, str]


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "unknown"
    text = str(value)
    return text if text else "unknown"


def stack_of(rows: pd.DataFrame) -> dict[str, str]:
    """The stack a run measured, from its first row: "unknown" where the file does not say."""
    first = rows.iloc[0]
    return {c: _text(first[c]) if c in rows else "unknown" for c in STACK_ID_COLUMNS}


def stack_id(stack: dict[str, str]) -> str:
    """A short, stable id of a stack: equal stacks, equal ids, whatever the order of the keys."""
    return hashlib.sha256(json.dumps(stack, sort_keys=True).encode()).hexdigest()[:12]


@contextmanager
def connect(db: Path, *, create: bool) -> Iterator[sqlite3.Connection]:
    """The store at ``db``; a missing one is made only where ``create`` (``history add``)."""
    if not create and not db.is_file():
        raise HistoryError(f"{db}: no such history database: lorabench history add --db {db} RUN.csv makes one")
    try:
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_TABLES)
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{db}: not a lorabench history database ({exc})") from None
    try:
        yield conn
    finally:
        conn.close()


def _runs_in(path: Path) -> list[tuple[str, pd.DataFrame]]:
    """The runs a result file holds (a fixed output file holds several), each as its rows."""
    try:
        rows = read_result_csv(path)
    except CompareError as exc:
        raise HistoryError(str(exc)) from None
    missing = [c for c in (*REQUIRED_KEY, *CORE_METRICS, "timestamp", "run_id") if c not in rows.columns]
    if missing:
        raise HistoryError(f"{path}: not a lorabench result file: missing columns {', '.join(missing)}")
    if rows.empty or rows["run_id"].isna().any():
        raise HistoryError(f"{path}: has no result rows, or rows without a run_id: write it with lorabench again")
    keyed_rows = keyed(rows.assign(**{m: float("nan") for m in METRICS if m not in rows}))
    return [(str(run_id), group) for run_id, group in keyed_rows.groupby("run_id", sort=False)]


def _row_values(rows: pd.DataFrame, run_id: str) -> list[tuple[str, str, str, int, str]]:
    builds = rows["build"] if "build" in rows else pd.Series(0, index=rows.index)
    out = []
    for (_, row), build in zip(rows.iterrows(), builds):
        metrics = {m: float(row[m]) for m in METRICS if pd.notna(row[m])}
        out.append((run_id, row["_key"], str(row["_engine"]), int(build), json.dumps(metrics)))
    return out


def add_runs(db: Path, paths: Sequence[Path]) -> list[tuple[StoredRun, bool]]:
    """Add every run of ``paths``; each with whether it was new. All files are read and
    checked before the first is added, so bad input adds nothing."""
    runs = [(path, run_id, rows) for path in paths for run_id, rows in _runs_in(path)]
    added = []
    with connect(db, create=True) as conn:
        for path, run_id, rows in runs:
            stack = stack_of(rows)
            stored = StoredRun(run_id, str(rows["timestamp"].max()), stack_id(stack), stack)
            conn.execute("BEGIN IMMEDIATE")
            try:
                new = conn.execute(
                    "INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?)",
                    (run_id, stored.timestamp, stored.stack_id, json.dumps(stack), str(path)),
                ).rowcount
                if new:
                    conn.executemany("INSERT INTO rows VALUES (?, ?, ?, ?, ?)", _row_values(rows, run_id))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            added.append((stored, bool(new)))
    return added


def stored_runs(conn: sqlite3.Connection) -> list[StoredRun]:
    """Every run in the store, oldest first (by the time its last case finished)."""
    found = conn.execute("SELECT run_id, timestamp, stack_id, stack FROM runs ORDER BY timestamp, run_id")
    return [StoredRun(r, t, s, json.loads(stack)) for r, t, s, stack in found]


def case_rows(conn: sqlite3.Connection, case_key: str | None = None) -> pd.DataFrame:
    """Every stored row (of one case where ``case_key`` is given): run, case, engine, build
    and one column per metric."""
    query = "SELECT run_id, case_key, engine, build, metrics FROM rows"
    found = conn.execute(query + (" WHERE case_key = ?" if case_key else ""), (case_key,) if case_key else ())
    records = [{"run_id": r, "case_key": c, "engine": e, "build": b, **json.loads(m)} for r, c, e, b, m in found]
    return pd.DataFrame.from_records(records, columns=["run_id", "case_key", "engine", "build", *METRICS])
