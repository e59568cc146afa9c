"""The results store: every run added to one SQLite file, keyed by its run id and its stack.

SQLite, not DuckDB: it ships with Python, so the store shares vLLM's environment with no
wheel to pin, and a file that several workers append to at once is what it is built for
(one writer at a time, the others wait on its lock; ``BUSY_TIMEOUT_S``). The history reads
one case at a time, which an index serves; nothing here needs a column store. CSV stays the
interchange: a run is added from its result file, and nothing is kept that the file does
not say.

A run is added whole, in one transaction, or not at all; adding a run the store holds
already (the same ``run_id``) changes nothing, unless its file has more rows than were
stored: a run added while its session was still writing is replaced by the whole of it.
Commits are not flushed to the disk one by one (WAL with ``synchronous=NORMAL``): a power
cut may lose the last runs added, never the store, and the result files they came from are
still there to add again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lorabench.analysis.cases import KEY_SEP, MATCH_KEY
from lorabench.analysis.history.runs import HistoryError, ReadRun, read_runs
from lorabench.results.schema import OLDER_FILES

# How long a writer waits for another's transaction to end before it gives up.
BUSY_TIMEOUT_S = 120.0

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
CREATE INDEX IF NOT EXISTS rows_by_run ON rows(run_id);
CREATE TABLE IF NOT EXISTS digests (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    model TEXT NOT NULL,
    device_type TEXT NOT NULL,
    adapter TEXT NOT NULL,
    digests TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS digests_by_run ON digests(run_id);
CREATE TABLE IF NOT EXISTS settings (
    run_id TEXT PRIMARY KEY REFERENCES runs(run_id),
    settings TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS accepted (
    run_id TEXT NOT NULL,
    case_expr TEXT NOT NULL,
    metric TEXT NOT NULL,
    reason TEXT NOT NULL,
    accepted_at TEXT NOT NULL,
    retire INTEGER NOT NULL DEFAULT 0
);
"""
# The store's layout: 2 records the columns its case keys hold (``meta.key_columns``) and
# acceptances; a store of 1 is migrated when opened (``_migrate``).
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class StoredRun:
    run_id: str
    timestamp: str
    stack_id: str
    stack: dict[str, str]
    # The config the run ran with, flat; None where unknown (no config kept, or a store
    # written before settings were stored).
    settings: dict[str, str] | None = None


def stack_id(stack: dict[str, str]) -> str:
    """A short, stable id of a stack: equal stacks, equal ids, whatever the order of the keys."""
    return hashlib.sha256(json.dumps(stack, sort_keys=True).encode()).hexdigest()[:12]


@contextmanager
def connect(db: Path, *, create: bool) -> Iterator[sqlite3.Connection]:
    """The store at ``db``; a missing one is made only where ``create`` (``history add``)."""
    if not create and not db.is_file():
        raise HistoryError(f"{db}: no such history database: lorabench history add --db {db} RUN.csv makes one")
    if not db.parent.is_dir():
        raise HistoryError(f"--db {db}: no folder {db.parent}: make it, or name a file in a folder that exists")
    try:
        if create:
            conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "runs" not in tables:  # another program's database, named by mistake
                conn.close()
                raise sqlite3.DatabaseError(f"it holds other tables ({', '.join(sorted(tables))}) and no runs")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_TABLES)
        else:  # a reader changes nothing, not even another program's database named by mistake
            conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"runs", "rows", "digests"} <= tables:
                conn.close()
                raise sqlite3.DatabaseError("it has no runs, rows and digests tables")
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{db}: not a lorabench history database ({exc})") from None
    try:
        if _version(conn) != SCHEMA_VERSION or _key_columns(conn) != list(MATCH_KEY):
            conn.close()  # a lorabench store of another layout: opened to be migrated, once
            conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            _migrate(conn, db)
        yield conn
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{db}: cannot be read as a lorabench history database ({exc})") from None
    finally:
        conn.close()


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _key_columns(conn: sqlite3.Connection) -> list[str] | None:
    """The columns the stored case keys hold, in order; None where the store does not say."""
    try:
        found = conn.execute("SELECT value FROM meta WHERE name = 'key_columns'").fetchone()
    except sqlite3.OperationalError:  # no meta table: a store of schema 1
        return None
    return json.loads(found[0]) if found else None


def _migrate(conn: sqlite3.Connection, db: Path) -> None:
    """Bring a store to ``SCHEMA_VERSION`` and this lorabench's key columns, in one transaction
    (two processes opening an old store at once migrate it once): each stored case key
    rewritten by column name, a column added since given the value a file from before it is
    read with (``OLDER_FILES``: runs added later then share its cases). A store that never
    said which columns its keys hold is taken to hold these only where every key has as many;
    one whose keys hold a column this lorabench lacks (written by a newer one) is refused, not
    merged."""
    conn.executescript(_TABLES)
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _version(conn) == SCHEMA_VERSION and _key_columns(conn) == list(MATCH_KEY):
            conn.execute("COMMIT")  # another process migrated it meanwhile
            return
        _rekey(conn, db, _key_columns(conn))
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('key_columns', ?)", (json.dumps(list(MATCH_KEY)),))
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _rekey(conn: sqlite3.Connection, db: Path, columns: list[str] | None) -> None:
    keys = case_keys(conn)
    if columns is None:
        widths = {len(k.split(KEY_SEP)) for k in keys}
        if widths - {len(MATCH_KEY)}:
            raise HistoryError(
                f"{db}: its case keys hold {', '.join(map(str, sorted(widths)))} columns and this lorabench's "
                f"{len(MATCH_KEY)}, and the store (from before lorabench recorded them) does not say which: "
                f"add the runs' result files to a new store (lorabench history add --db NEW.db RESULTS)"
            )
        return
    unknown = [c for c in columns if c not in MATCH_KEY]
    if unknown:
        raise HistoryError(
            f"{db}: its case keys hold {', '.join(unknown)}, which this lorabench does not know (a newer "
            "lorabench wrote it): use that lorabench, or add the result files to a new store"
        )
    for key in keys:
        values = dict(zip(columns, key.split(KEY_SEP)))
        new = KEY_SEP.join(values.get(c, OLDER_FILES.get(c, "")) for c in MATCH_KEY)
        if new != key:
            conn.execute("UPDATE rows SET case_key = ? WHERE case_key = ?", (new, key))


ADDED, GREW, STORED = "added", "grew", "already stored"


def _insert(conn: sqlite3.Connection, run: ReadRun) -> tuple[StoredRun, str]:
    """Add ``run`` whole; a run stored with fewer rows than its file now has (added while
    its session was still writing) is replaced by the file's; one stored whole is left."""
    stored = StoredRun(run.run_id, run.timestamp, stack_id(run.stack), run.stack, run.settings)
    conn.execute("BEGIN IMMEDIATE")
    try:
        (held,) = conn.execute("SELECT count(*) FROM rows WHERE run_id = ?", (run.run_id,)).fetchone()
        known = conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run.run_id,)).fetchone() is not None
        status = STORED if known and held >= len(run.rows) else GREW if known else ADDED
        if status != STORED:
            for table in ("rows", "digests", "settings", "runs"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run.run_id,))  # noqa: S608 - our own names
            conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?)",
                (run.run_id, run.timestamp, stored.stack_id, json.dumps(run.stack), str(run.source)),
            )
            conn.executemany(
                "INSERT INTO rows VALUES (?, ?, ?, ?, ?)",
                [(run.run_id, key, engine, build, json.dumps(m)) for key, engine, build, m in run.rows],
            )
            conn.executemany(
                "INSERT INTO digests VALUES (?, ?, ?, ?, ?)",
                [(run.run_id, *key, ", ".join(sorted(d))) for key, d in run.digests.items()],
            )
        if run.settings is not None:  # read from the run's own config: a run stored without them learns them
            conn.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (run.run_id, json.dumps(run.settings)))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return stored, status


def add_runs(db: Path, paths: Sequence[Path], only: str | None = None) -> list[tuple[StoredRun, str]]:
    """Add every run of ``paths`` (only the run ``only`` where given: a session's own, in a
    fixed output file that holds others); each with what became of it (``ADDED``, ``GREW``,
    ``STORED``). All files are read and checked before the first is added, so bad input
    adds nothing."""
    runs = [run for path in paths for run in read_runs(path) if only is None or run.run_id == only]
    with connect(db, create=True) as conn:
        try:
            return [_insert(conn, run) for run in runs]
        except sqlite3.Error as exc:  # locked past the timeout, a full disk: the runs before it are kept
            raise HistoryError(f"{db}: could not add a run ({exc}); add the rest again: what is stored stays") from None


def stored_runs(conn: sqlite3.Connection) -> list[StoredRun]:
    """Every run in the store, oldest first (by the time its last case finished)."""
    kept = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'settings'").fetchone()
    settings = "settings.settings" if kept else "NULL"  # a store from before settings were kept
    found = conn.execute(
        f"SELECT runs.run_id, timestamp, stack_id, stack, {settings} FROM runs "  # noqa: S608 - our own names
        + ("LEFT JOIN settings ON settings.run_id = runs.run_id " if kept else "")
        + "ORDER BY timestamp, runs.run_id"
    )
    return [StoredRun(r, t, s, json.loads(stack), json.loads(flat) if flat else None) for r, t, s, stack, flat in found]


def case_keys(conn: sqlite3.Connection) -> list[str]:
    return [key for (key,) in conn.execute("SELECT DISTINCT case_key FROM rows ORDER BY case_key")]


def case_rows(conn: sqlite3.Connection, case_key: str) -> list[tuple[str, int, dict[str, float]]]:
    """One case's stored rows: (run, build, metrics)."""
    found = conn.execute("SELECT run_id, build, metrics FROM rows WHERE case_key = ?", (case_key,))
    return [(run_id, build, json.loads(metrics)) for run_id, build, metrics in found]


def run_digests(conn: sqlite3.Connection, run_id: str) -> dict[tuple[str, str, str], str]:
    """A run's adapters' output digests: (model, device type, adapter) -> its digests, joined."""
    found = conn.execute("SELECT model, device_type, adapter, digests FROM digests WHERE run_id = ?", (run_id,))
    return {(m, d, a): digests for m, d, a, digests in found}


@dataclass(frozen=True)
class Acceptance:
    """A known change or a retired case, said with ``history accept``: for the cases ``-k``
    selects (and ``metric``, or every one: ``*``), the runs from ``run_id`` on are the baseline."""

    run_id: str
    case_expr: str
    metric: str
    reason: str
    accepted_at: str
    retire: bool = False  # the cases are retired: missing from the runs from run_id on is no failure


def accept(db: Path, found: Acceptance) -> None:
    with connect(db, create=True) as conn:
        values = (found.run_id, found.case_expr, found.metric, found.reason, found.accepted_at, int(found.retire))
        conn.execute("INSERT INTO accepted VALUES (?, ?, ?, ?, ?, ?)", values)


def acceptances(conn: sqlite3.Connection) -> list[Acceptance]:
    """Every acceptance, oldest first."""
    found = conn.execute(
        "SELECT run_id, case_expr, metric, reason, accepted_at, retire FROM accepted ORDER BY accepted_at"
    )
    return [Acceptance(*row[:5], bool(row[5])) for row in found]
